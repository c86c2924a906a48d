"""What the loader serves is what the manifest vouches for: local shards are checked before their first use,
and a decoded cache entry is mapped only when the loader itself wrote it whole."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_corpus
from loader_checks import take

from marin_data.corpus.shard import read_shard, write_shard
from marin_data.errors import LoaderConfigError, ShardChecksumError
from marin_data.loader import LoaderConfig, make_loader
from marin_data.loader.cache import SEAL, DecodedShardCache

CONFIG = LoaderConfig(seq_len=16, batch_size=4, val_fraction=0.0)


@pytest.fixture
def corpus(tmp_path):
    return build_corpus(tmp_path / "corpus", {"a": [30, 20]}, doc_tokens=(1, 30))


def _rewrite_with_one_token_changed(corpus, shard) -> None:
    """A shard pyarrow still reads, holding one other token id: only its SHA-256 gives it away."""
    ids, tokens, offsets = read_shard(corpus.root / shard.path)
    tokens = tokens.copy()
    tokens[3] ^= 1
    write_shard(corpus.root / shard.path, ids, tokens, offsets, corpus.manifest.tokenizer)


def test_a_modified_local_shard_is_refused_before_it_is_served_unless_opted_out(corpus, tmp_path):
    _rewrite_with_one_token_changed(corpus, corpus.shards[0])
    with pytest.raises(ShardChecksumError, match="modified"):
        take(make_loader(corpus.root, CONFIG, cache_dir=tmp_path / "c1", prefetch=0), 20)
    served = take(make_loader(corpus.root, CONFIG, cache_dir=tmp_path / "c2", prefetch=0, verify_shards=False), 2)
    assert len(served) == 2  # the opt-out reads it as it is


def test_only_a_sealed_decode_the_loader_wrote_is_mapped(corpus, tmp_path):
    shard = corpus.shards[0]
    cache = DecodedShardCache(corpus.root, tmp_path / "c")
    cache.ensure(shard)
    tokens_path, offsets_path = cache.paths(shard)
    good = np.load(tokens_path).copy()
    assert (tokens_path.parent / SEAL).is_file()

    edited = good.copy()
    edited[5] ^= 1
    np.save(tokens_path, edited)  # edited in place after the seal: decoded again, not served
    again = DecodedShardCache(corpus.root, tmp_path / "c")
    assert np.array_equal(again.open(shard).tokens, good)
    again.wait()

    (tokens_path.parent / SEAL).unlink()  # a decode nobody sealed (partial, or put there by hand)
    np.save(tokens_path, edited)
    fresh = DecodedShardCache(corpus.root, tmp_path / "c")
    fresh.ensure(shard)
    assert np.array_equal(fresh.open(shard).tokens, good) and (tokens_path.parent / SEAL).is_file()


def test_a_fractional_seq_len_or_a_non_boolean_segments_is_a_loader_config_error(corpus, tmp_path):
    with pytest.raises(LoaderConfigError, match=r"seq_len=128\.0: must be whole numbers"):
        make_loader(corpus.root, LoaderConfig(seq_len=128.0), cache_dir=tmp_path / "c")
    with pytest.raises(LoaderConfigError, match="segments='yes': must be True or False"):
        make_loader(corpus.root, LoaderConfig(segments="yes"), cache_dir=tmp_path / "c")


def test_a_shard_of_int64_tokens_listed_with_its_hash_and_counts_is_refused_by_plain_verify_and_the_loader(
        corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_data.fileio.atomic import sha256_file
    from marin_data.corpus.commit import commit_corpus
    from marin_data.corpus.verify import ProblemKind, verify_corpus
    from marin_data.errors import ShardFormatError

    shard = corpus.shards[0]
    ids, tokens, offsets = read_shard(corpus.root / shard.path)
    wide = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(tokens.astype(np.int64)))
    pq.write_table(pa.table({"id": ids, "tokens": wide}), corpus.root / shard.path)
    digest, size = sha256_file(corpus.root / shard.path)
    commit_corpus(corpus.root, corpus.manifest, [shard._replace(sha256=digest, bytes=size), *corpus.shards[1:]])
    report = verify_corpus(corpus.root)  # without deep: from the footer
    assert [(p.path, p.kind) for p in report.problems] == [(shard.path, ProblemKind.BAD_FORMAT)]
    assert "int64" in report.problems[0].message
    with pytest.raises(ShardFormatError, match="int64"):
        take(make_loader(corpus.root, CONFIG, cache_dir=tmp_path / "c", prefetch=0), 40)
