"""The remote shard cache's two fetch paths: a shard into memory and decoded from there (the default for
shards up to ``memory_bytes``), or through a file on disk (larger ones). Both serve the batches of a local
read bit for bit whatever the decode threads; a connection dropped mid-prefetch resumes, or, when every try
drops, fails the batch with `TransferFailedError`; and the cache's byte limit holds with the fetched bytes in
memory, nothing of them ever on disk.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_corpus
from faultproxy import Fault
from s3_env import FAST, bucket_url, moto, proxy  # noqa: F401 - fixtures
from test_loader_remote import DiskWatch, corpus_decoded

from marin_data.errors import TransferFailedError
from marin_data.formats.marin import ParquetDecoder
from marin_data.loader import LoaderConfig, TokenDataset, TokenStream
from marin_data.loader.remote.cache import RemoteShardCache
from marin_data.loader.remote.stream import RemoteStream, open_remote_corpus
from marin_data.stores import open_store
from marin_data.transfer.publish_s3 import publish

CONFIG = LoaderConfig(seq_len=48, batch_size=4, mixture={"a": 0.7, "b": 0.3}, val_fraction=0.01)
STEPS = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two subsets of 4 shards, ~8 row groups each: the threads decode several row groups of one shard at once."""
    return build_corpus(tmp_path_factory.mktemp("fetch") / "corpus", {"a": [60] * 4, "b": [40] * 4},
                        doc_tokens=(20, 80), row_group_tokens=400, seed=5)


@pytest.fixture
def url(corpus, bucket_url, moto):  # noqa: F811
    import shutil

    copy = corpus.root.parent / f"copy-{bucket_url.split('/')[2]}"
    shutil.copytree(corpus.root, copy)
    publish(copy, to=bucket_url, endpoint_url=moto, progress=False)
    return bucket_url


def remote_batches(url: str, endpoint: str, cache_dir, *, threads: int, memory_bytes: int,
                   max_bytes: int = 1 << 30, prefetch: int = 4) -> tuple[list[dict], RemoteShardCache]:
    """The first `STEPS` batches through a cache whose decoder uses ``threads``, and the (closed) cache."""
    stores = [open_store(url, endpoint_url=endpoint)]
    corpus = open_remote_corpus(stores, meta_dir=cache_dir / "meta")
    decoder = ParquetDecoder(corpus, threads=threads)
    cache = RemoteShardCache(stores, cache_dir / "shards", max_bytes=max_bytes, prefetch=prefetch, policy=FAST,
                             decoder=decoder, memory_bytes=memory_bytes)
    stream = RemoteStream(corpus, CONFIG, cache=cache)
    try:
        it = iter(TokenDataset(stream, prefetch=0))
        return [next(it) for _ in range(STEPS)], cache
    finally:
        stream.close()


def same(batches: list[dict], reference: list[dict]) -> bool:
    return all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
               for a, b in zip(batches, reference, strict=True))


def test_both_fetch_paths_serve_a_local_read_bit_for_bit_whatever_the_decode_threads(corpus, url, moto,
                                                                                      tmp_path):  # noqa: F811
    local = TokenStream(corpus, CONFIG, cache_dir=tmp_path / "local")
    it = iter(TokenDataset(local, prefetch=0))
    reference = [next(it) for _ in range(STEPS)]
    for threads in (1, 3):
        for memory_bytes in (0, 1 << 30):  # through a file; in memory
            got, cache = remote_batches(url, moto, tmp_path / f"c{threads}-{memory_bytes}", threads=threads,
                                        memory_bytes=memory_bytes)
            assert same(got, reference), (threads, memory_bytes)
            assert sum(cache.stats().fetches.values()) >= 2


def test_a_connection_dropped_mid_prefetch_resumes_from_where_it_stopped(corpus, url, proxy, tmp_path):  # noqa: F811
    victim = corpus.shards[0].path
    proxy.add(Fault("drop", match=victim, fraction=0.5, times=1))
    local = TokenStream(corpus, CONFIG, cache_dir=tmp_path / "local")
    it = iter(TokenDataset(local, prefetch=0))
    reference = [next(it) for _ in range(STEPS)]
    got, cache = remote_batches(url, proxy.endpoint, tmp_path / "c", threads=2, memory_bytes=1 << 30)
    assert same(got, reference)
    asked = proxy.requests(victim)
    assert [r.fault for r in asked] == ["drop", None]
    assert asked[0].range is None and asked[1].range.startswith("bytes=") and asked[1].range != "bytes=0-"
    assert cache.stats().fetches[victim] == 1


def test_a_connection_that_always_drops_fails_the_batch_with_transfer_failed(corpus, url, proxy,
                                                                             tmp_path):  # noqa: F811
    for shard in corpus.shards:
        proxy.add(Fault("drop", match=shard.path, fraction=0.5, times=1000))  # the prefetch's tries, then open's
    with pytest.raises(TransferFailedError, match="could not fetch a verified copy"):
        remote_batches(url, proxy.endpoint, tmp_path / "c", threads=2, memory_bytes=1 << 30)


@pytest.mark.parametrize("memory_bytes", [0, 1 << 30])
def test_the_byte_limit_holds_and_fetched_bytes_in_memory_never_touch_the_disk(corpus, url, moto, tmp_path,
                                                                                memory_bytes):  # noqa: F811
    limit = int(0.4 * corpus_decoded(corpus)) + max(s.bytes for s in corpus.shards)
    with DiskWatch(tmp_path / "c" / "shards") as disk, DiskWatch(tmp_path / "c" / "shards" / "fetch") as fetched:
        _, cache = remote_batches(url, moto, tmp_path / "c", threads=2, memory_bytes=memory_bytes, max_bytes=limit,
                                  prefetch=2)
    stats = cache.stats()
    assert stats.high_water <= limit and disk.peak <= limit and stats.evictions > 0
    assert (fetched.peak > 0) == (memory_bytes == 0)  # through a file only when the shard is over memory_bytes


def test_a_corrupted_body_in_memory_is_fetched_again_and_never_decoded(corpus, url, proxy, tmp_path):  # noqa: F811
    victim = corpus.shards[1].path
    proxy.add(Fault("corrupt", match=victim, times=1))
    local = TokenStream(corpus, CONFIG, cache_dir=tmp_path / "local")
    it = iter(TokenDataset(local, prefetch=0))
    reference = [next(it) for _ in range(STEPS)]
    got, _ = remote_batches(url, proxy.endpoint, tmp_path / "c", threads=2, memory_bytes=1 << 30)
    assert same(got, reference)
    assert [r.fault for r in proxy.requests(victim)] == ["corrupt", None]
