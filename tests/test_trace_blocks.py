"""A trace decodes only the blosc blocks its lookups need: every block of a real Levanter frame (lz4 and zstd)
decodes as the whole frame does, and lookups over caches with many blocks per inner chunk give the answers a
whole decode of the offsets gives."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from levanter_env import VOCAB, documents

from marin_data.errors import CacheFormatError
from marin_data.levanter import LZ4, ZSTD, open_cache, write_cache
from marin_data.levanter.arraymeta import ArrayMeta, Blosc, parse_array_meta
from marin_data.levanter.chunkfile import EMPTY, block_items, decode_block, decode_inner, encode_chunk, read_index
from marin_data.levanter.order.offsets import InnerChunks
from marin_data.levanter.order.sources import ComponentCache
from marin_data.stores.local import LocalStore

FIXTURES = Path(__file__).parent / "fixtures" / "levanter"
CHUNK_FILES = sorted(FIXTURES.glob("**/input_ids/*/c/*"))


def frames(path: Path):
    """(meta, inner chunk number, stored frame) of every stored inner chunk of a chunk file."""
    meta = parse_array_meta((path.parent.parent / "zarr.json").read_bytes(), str(path))
    data = path.read_bytes()
    table = read_index(data[-meta.index_bytes:], len(data), meta, str(path))
    for i, (offset, size) in enumerate(table.tolist()):
        if offset != EMPTY:
            yield meta, i, data[offset:offset + size]


@pytest.mark.parametrize("path", CHUNK_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_block_of_a_real_levanter_frame_decodes_as_the_whole_frame(path):
    for meta, i, frame in frames(path):
        items = block_items(frame, meta, str(path))
        blocks = [decode_block(frame, meta, j, items, str(path)) for j in range(-(-meta.inner // items))]
        np.testing.assert_array_equal(np.concatenate(blocks), decode_inner(frame, meta, str(path)))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("shuffle", ["noshuffle", "shuffle", "bitshuffle"])
@pytest.mark.parametrize("cname, clevel", [("lz4", 5), ("zstd", 1), ("lz4", 0)])
def test_every_block_decodes_as_the_whole_frame_whatever_the_codec(dtype, shuffle, cname, clevel):
    meta = ArrayMeta(dtype, chunk=65_536, inner=65_536, blosc=Blosc(cname, clevel, shuffle, 8_192))
    values = np.cumsum(np.random.default_rng(4).integers(0, 3_000, meta.inner)).astype(dtype)
    frame = encode_chunk(values, meta)[:-meta.index_bytes]
    items = block_items(frame, meta, "f")
    assert items < meta.inner  # blosc picks the block size near the one asked for
    blocks = [decode_block(frame, meta, j, items, "f") for j in range(-(-meta.inner // items))]
    np.testing.assert_array_equal(np.concatenate(blocks), values)


@pytest.mark.parametrize("cache, items", [("tokenized-int64-lz4", 131_072), ("consolidated-int64-zstd", 4_096)])
def test_real_offsets_of_both_codecs_are_decoded_a_block_at_a_time(cache, items):
    meta, _, frame = next(frames(FIXTURES / cache / "input_ids" / "offsets" / "c" / "0"))
    assert block_items(frame, meta, cache) == items


def test_a_frame_whose_block_start_lies_is_refused_naming_the_file():
    path = FIXTURES / "consolidated-int64-zstd" / "input_ids" / "offsets" / "c" / "0"
    meta, _, frame = next(frames(path))
    items = block_items(frame, meta, str(path))
    bad = bytearray(frame)
    struct.pack_into("<I", bad, 16 + 4, 2**31 - 1)  # block 1 starts far past the frame
    with pytest.raises(CacheFormatError, match="block 1") as e:
        decode_block(bytes(bad), meta, 1, items, f"{path} inner chunk 0")
    assert str(path) in str(e.value.path)


def skewed(n: int) -> list[np.ndarray]:
    """Short documents, then long ones: a guess by the average length lands far from the row."""
    rng = np.random.default_rng(3)
    return [rng.integers(2, VOCAB, 1 if r < n * 9 // 10 else 400) for r in range(n)]


@pytest.mark.parametrize("budget", [None, 40_000], ids=["kept", "dropped"])  # 40 kB: blocks are dropped and read again
@pytest.mark.parametrize("codec", [LZ4, ZSTD], ids=["lz4", "zstd"])
@pytest.mark.parametrize("docs", [lambda: documents(20_000, 0), lambda: skewed(20_000)], ids=["even", "skewed"])
def test_lookups_across_blocks_and_inner_chunks_match_a_whole_decode(tmp_path, codec, docs, budget):
    docs = docs()
    write_cache(tmp_path, docs, codec=codec, chunk=65_536, inner=16_384, tokenizer="tiny", vocab_size=VOCAB)
    kept = InnerChunks() if budget is None else InnerChunks(budget)
    cache = ComponentCache("c", open_cache(LocalStore(tmp_path)), kept=kept)
    ends = np.cumsum([len(d) for d in docs])
    starts, tokens = ends - [len(d) for d in docs], np.concatenate(docs)
    rng = np.random.default_rng(1)
    cuts = list(rng.integers(0, int(ends[-1]), 300)) + [int(ends[4_095]), int(ends[16_382]), int(ends[-1]) - 5]
    for start in cuts:
        stop = min(int(start) + int(rng.integers(1, 3_000)), int(ends[-1]))
        rows = range(int(np.searchsorted(ends, start, side="right")), int(np.searchsorted(starts, stop)))
        want = [(r, max(start, starts[r]) - starts[r], min(stop, ends[r]) - 1 - starts[r]) for r in rows]
        assert [(d.row, d.first, d.last) for d in cache.documents(start, stop)] == want
        np.testing.assert_array_equal(cache.tokens_in(start, stop), tokens[start:stop])
    for row in (0, 4_095, 4_096, 16_383, len(docs) - 1):
        assert cache.row_tokens(row) == (starts[row], ends[row])
    offsets = cache.offsets(0)
    if codec is ZSTD and budget is None:  # 4,096 offsets a block: lookups decode parts of inner chunks
        assert offsets.block_reads > offsets.inner_reads
