"""Remote corpora read by DataLoader worker processes: the stream of the in-process loader, resumed exactly at
another world size or worker count, each shard fetched once by a rank's workers within the rank's cache
limit, over the real S3 server (moto behind the fault proxy); forked workers never touch the parent's cache."""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import replace

import numpy as np
import pytest
from loader_checks import check_global_stream, take
from s3_env import FAST, bucket_url, moto, proxy  # noqa: F401 - fixtures
from test_loader_remote import (CONFIG, DiskWatch, corpus, corpus_decoded, mixed, one_pass_config,  # noqa: F401
                                published, stream_and_compare)

from marin_data.loader import LoaderConfig, Phase, TokenLoader, TokenStream, make_loader
from marin_data.loader.remote.cache import RemoteShardCache
from marin_data.loader.remote.stream import make_remote_loader
from marin_data.stores import open_store
from marin_data.transfer.publish_s3 import publish

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers, 2 cores


def test_two_workers_serve_the_in_process_stream_fetch_each_shard_once_and_keep_the_limit(
        corpus, published, proxy, tmp_path):  # noqa: F811
    url, _ = published
    limit = int(0.6 * corpus_decoded(corpus))  # the rank's: 0.3 of the corpus for each worker
    config = one_pass_config(corpus)
    local = TokenStream(corpus, config, cache_dir=tmp_path / "local")
    loader = make_loader(url, config, num_workers=2, cache_dir=tmp_path / "cache", cache_bytes=limit, policy=FAST,
                         endpoint_url=proxy.endpoint)
    with DiskWatch(tmp_path / "cache") as disk:
        assert stream_and_compare(loader, local, local.stop()) == local.stop()  # the whole pass, in order
    assert loader.state_dict()["position"] == local.stop()  # what the trainer received
    assert 0 < disk.peak <= limit
    # Both workers read shards of every global batch: a shard was fetched by one of them, linked by the other.
    assert {s.path: len(proxy.requests(s.path)) for s in corpus.shards} == {s.path: 1 for s in corpus.shards}
    assert sorted(p.name for p in (tmp_path / "cache").glob("*-rank0-worker*")) == [
        f"{loader.dataset.stream.plan.name}-rank0-worker{w}" for w in (0, 1)]


def _ranks(url: str, config: LoaderConfig, world: int, workers: int, steps: int, state, cache, moto_url):
    loaders = [make_loader(url, config, rank=r, world_size=world, num_workers=workers, state=state,
                           cache_dir=cache, cache_bytes=1 << 24, policy=FAST, endpoint_url=moto_url)
               for r in range(world)]
    out = [take(loader, steps) for loader in loaders]
    for loader in loaders:
        loader.dataset.stream.close()  # an in-process rank's cache (its workers' end with them)
    return out, loaders[0].state_dict()


def test_a_checkpoint_taken_with_workers_resumes_exactly_at_another_world_size_and_worker_count(
        mixed, bucket_url, moto, tmp_path):  # noqa: F811
    import shutil

    shutil.copytree(mixed.root, tmp_path / "copy")
    publish(tmp_path / "copy", to=bucket_url, endpoint_url=moto, progress=False)
    config = LoaderConfig(seq_len=32, batch_size=2, shuffle_window=1, val_fraction=0.01, mixture_block=16,
                          mixture={n: 0.25 for n in "abcd"})
    local = TokenStream(mixed, config, cache_dir=tmp_path / "local")
    state, position = None, 0
    for world, workers, per_rank_batch in ((2, 2, 2), (1, 3, 4), (4, 0, 1)):  # (ranks, workers, per-rank batch)
        run = replace(config, batch_size=per_rank_batch)
        got, state = _ranks(bucket_url, run, world, workers, 3, state, tmp_path / "cache", moto)
        check_global_stream(got, position, local.read(np.arange(position, position + 3 * world * per_rank_batch)),
                            stream=local)  # dealt by shard, as remote streams are
        position += 3 * world * per_rank_batch
        assert state["position"] == position


def _in_child(cache: RemoteShardCache, shard, out) -> None:
    out.put(cache.stats().max_bytes)  # would wait forever on the lock a parent thread held at the fork
    try:
        cache.open(shard)
    except RuntimeError as e:
        out.put(str(e))
    cache.close()  # must not release the parent's lock on the directory


def test_a_forked_child_gets_a_fresh_lock_no_threads_and_never_reads_or_frees_the_parent_s_cache(
        corpus, tmp_path):  # noqa: F811
    from filelock import FileLock, Timeout

    cache = RemoteShardCache([open_store(corpus.root)], tmp_path / "cache", max_bytes=corpus_decoded(corpus))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a fetch thread inside the cache's lock at the moment of the fork
        with cache._cond:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_in_child, args=(cache, corpus.shards[0], out))
    child.start()
    try:
        assert out.get(timeout=60) == corpus_decoded(corpus)
        assert "forked from" in out.get(timeout=60)
    finally:
        release.set()
        holder.join(timeout=10)
        child.join(timeout=60)
    assert child.exitcode == 0
    with pytest.raises(Timeout):  # still the parent's
        FileLock(str(tmp_path / "cache" / ".cache.lock"), timeout=0).acquire()
    assert cache.open(corpus.shards[0]).tokens.size == corpus.shards[0].tokens  # the parent's cache still works
    cache.close()


@pytest.mark.slow
def test_spawned_workers_open_their_own_stores_and_caches(corpus, published, moto, tmp_path):  # noqa: F811
    url, _ = published
    config = replace(CONFIG, mixture=[Phase({"a": 1.0}, 6 * CONFIG.batch_size)])
    remote = make_remote_loader(url, config, num_workers=1, cache_dir=tmp_path / "cache",
                                cache_bytes=corpus_decoded(corpus), policy=FAST, endpoint_url=moto)
    spawned = TokenLoader(remote.dataset, num_workers=1, multiprocessing_context="spawn")
    got = take(spawned, 6)
    expected = take(make_loader(corpus, config, cache_dir=tmp_path / "local"), 6)
    assert [b["index"].tolist() for b in got] == [b["index"].tolist() for b in expected]
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(got, expected))
