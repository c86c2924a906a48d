"""A Parquet shard decodes to the same bytes however many threads decode its row groups, and a loader over
such decodes serves the same batches bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_corpus
from loader_checks import take

from marin_data.corpus.shard import read_shard
from marin_data.errors import ShardFormatError
from marin_data.formats.marin import ParquetDecoder
from marin_data.loader import LoaderConfig, TokenDataset, TokenStream
from marin_data.loader.cache import DecodedShardCache

CONFIG = LoaderConfig(seq_len=32, batch_size=4, mixture={"a": 0.6, "b": 0.4}, val_fraction=0.0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):  # row groups of ~200 tokens: each shard has many
    return build_corpus(tmp_path_factory.mktemp("decode") / "corpus", {"a": [40, 25, 1], "b": [30]},
                        doc_tokens=(0, 60), row_group_tokens=200)


@pytest.mark.parametrize("threads", [1, 2, 3, 16])
def test_each_shard_decodes_to_its_written_tokens_and_offsets_whatever_the_threads(corpus, tmp_path, threads):
    for shard in corpus.shards:
        tokens_path, offsets_path = tmp_path / "t.npy", tmp_path / "o.npy"
        ParquetDecoder(threads=threads).decode_into(corpus.root / shard.path, shard, tokens_path, offsets_path,
                                                    verify=True)
        _, tokens, offsets = read_shard(corpus.root / shard.path)
        got_tokens, got_offsets = np.load(tokens_path), np.load(offsets_path)
        assert got_tokens.dtype == np.uint32 and got_offsets.dtype == np.int64
        assert np.array_equal(got_tokens, tokens) and np.array_equal(got_offsets, offsets)


def test_a_loader_serves_the_same_batches_bit_for_bit_whatever_the_decode_threads(corpus, tmp_path):
    served = []
    for threads in (1, 2, 5):
        decoder = ParquetDecoder(corpus, threads=threads)
        stream = TokenStream(corpus, CONFIG, source=DecodedShardCache(corpus.root, tmp_path / f"c{threads}",
                                                                      decoder=decoder), decoder=decoder)
        served.append(take(TokenDataset(stream, prefetch=0), 40))
        stream.source.wait()
    for other in served[1:]:
        assert all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
                   for a, b in zip(served[0], other, strict=True))


@pytest.mark.parametrize("threads", [1, 4])
def test_a_shard_holding_other_counts_than_its_index_is_refused_and_nothing_is_sealed(corpus, tmp_path, threads):
    shard = corpus.shards[0]._replace(tokens=corpus.shards[0].tokens - 1)
    cache = DecodedShardCache(corpus.root, tmp_path / "c", decoder=ParquetDecoder(corpus, threads=threads))
    with pytest.raises(ShardFormatError, match="holds 40 documents"):
        cache.ensure(shard)
    assert not list((tmp_path / "c").rglob("*.npy*"))
