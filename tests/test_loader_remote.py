"""Remote corpora in the loader: S3 (moto behind the fault proxy) and `marin-data serve` (hf://).

Every test streams with a cache smaller than the corpus and checks the batches against a local read of the
same corpus with the same config.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import build_corpus
from faultproxy import Fault
from loader_checks import check_global_stream
from s3_env import FAST, bucket_url, moto, proxy, s3_client  # noqa: F401 - fixtures

from marin_data.errors import LoaderConfigError, TransferFailedError
from marin_data.loader import LoaderConfig, Phase, TokenStream, make_loader
from marin_data.loader.remote.budget import decoded_bytes
from marin_data.loader.remote.stream import make_remote_loader
from marin_data.transfer.publish_s3 import publish

CONFIG = LoaderConfig(seq_len=64, batch_size=8, shuffle_window=1, val_fraction=0.01, segments=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """One subset of 16 shards of ~30k tokens (~120 KiB decoded each)."""
    return build_corpus(tmp_path_factory.mktemp("remote") / "corpus", {"a": [300] * 16}, doc_tokens=(50, 150), seed=1)


@pytest.fixture
def published(corpus, bucket_url, moto, tmp_path):  # noqa: F811
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(corpus.root, copy)  # publish records the bucket in the copy's manifest, not the fixture's
    publish(copy, to=bucket_url, endpoint_url=moto, progress=False)
    return bucket_url, copy


def one_pass_config(corpus) -> LoaderConfig:
    """CONFIG, ending after the whole batches of the first pass: nothing of the next pass is prefetched."""
    n = TokenStream(corpus, CONFIG, cache_dir=corpus.root / ".unused").sizes()["a"]
    return replace(CONFIG, mixture=[Phase({"a": 1.0}, n - n % CONFIG.batch_size)])


def corpus_decoded(corpus) -> int:
    return sum(decoded_bytes(s) for s in corpus.shards)


def one_pass(stream: TokenStream) -> int:
    """Positions of whole batches that stay within every subset's first pass."""
    sizes, p = stream.sizes(), 0
    while all(stream.served(p + CONFIG.batch_size)[k] <= v for k, v in sizes.items()):
        p += CONFIG.batch_size
    return p


class DiskWatch:
    """Samples the bytes of shard files under a cache directory on a thread: the real high-water mark."""

    def __init__(self, root: Path):
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for dirpath, _, files in os.walk(self.root):
                if "meta" in Path(dirpath).relative_to(self.root).parts[:1]:
                    continue
                for name in files:
                    try:
                        total += os.stat(os.path.join(dirpath, name)).st_size
                    except FileNotFoundError:
                        pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.002)

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def stream_and_compare(loader, local: TokenStream, stop: int) -> int:
    """Check the loader's batches before position ``stop`` against ``local``; returns how many rows it checked."""
    rows = 0
    for batch in loader:
        first = int(batch["index"][0])
        if first >= stop:
            break
        ref = local.read(range(first, first + CONFIG.batch_size))
        np.testing.assert_array_equal(batch["input_ids"].numpy(), ref.input_ids)
        np.testing.assert_array_equal(batch["segment_ids"].numpy(), ref.segment_ids)
        rows += CONFIG.batch_size
    return rows


def test_s3_pass_stays_under_the_cache_limit_fetches_each_shard_once_and_equals_a_local_read(
        corpus, published, proxy, tmp_path):  # noqa: F811
    url, _ = published
    limit = int(0.3 * corpus_decoded(corpus))  # under a third of the corpus
    config = one_pass_config(corpus)
    local = TokenStream(corpus, config, cache_dir=tmp_path / "local")
    loader = make_remote_loader(url, config, cache_dir=tmp_path / "cache", cache_bytes=limit, policy=FAST,
                                endpoint_url=proxy.endpoint)
    stream = loader.dataset.stream
    assert stream.fingerprint == local.fingerprint  # the same stream: a checkpoint resumes on either
    with DiskWatch(tmp_path / "cache") as disk:
        assert stream_and_compare(loader, local, local.stop()) == local.stop()  # the whole pass
    stats = stream.source.stats()
    stream.close()
    assert stats.high_water <= limit and disk.peak <= limit and disk.peak > 0
    # Every shard was read, fetched by exactly the GETs the cache counted, and only once in the pass.
    gets = {s.path: len(proxy.requests(s.path)) for s in corpus.shards}
    assert gets == dict(stats.fetches) and gets == {s.path: 1 for s in corpus.shards}


def test_a_corrupted_response_is_refetched_and_never_fed_to_the_model(corpus, published, proxy, tmp_path):  # noqa: F811
    url, _ = published
    victim = corpus.shards[0].path
    proxy.add(Fault("corrupt", match=victim, times=1))
    local = TokenStream(corpus, CONFIG, cache_dir=tmp_path / "local")
    loader = make_remote_loader(url, CONFIG, cache_dir=tmp_path / "cache", cache_bytes=corpus_decoded(corpus),
                                policy=FAST, endpoint_url=proxy.endpoint)
    stream_and_compare(loader, local, one_pass(local))
    loader.dataset.stream.close()
    assert [r.fault for r in proxy.requests(victim)] == ["corrupt", None]


def test_a_shard_corrupt_on_the_server_fails_over_to_a_mirror_or_fails_the_batch(corpus, published, proxy,
                                                                                  moto, tmp_path):  # noqa: F811
    url, copy = published
    victim = corpus.shards[3].path
    bucket, prefix = url[len("s3://"):].split("/", 1)
    data = bytearray((corpus.root / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    s3_client(moto).put_object(Bucket=bucket, Key=f"{prefix}/{victim}", Body=bytes(data))
    local = TokenStream(corpus, CONFIG, cache_dir=tmp_path / "local")

    with pytest.raises(TransferFailedError, match="differs from the listed"):
        loader = make_remote_loader(url, CONFIG, cache_dir=tmp_path / "c1", cache_bytes=corpus_decoded(corpus),
                                    policy=FAST, endpoint_url=proxy.endpoint)
        try:
            stream_and_compare(loader, local, one_pass(local))
        finally:
            loader.dataset.stream.close()

    proxy.reset_counts()
    loader = make_remote_loader(url, CONFIG, mirrors=[str(copy)], cache_dir=tmp_path / "c2",
                                cache_bytes=corpus_decoded(corpus), policy=FAST, endpoint_url=proxy.endpoint)
    stream_and_compare(loader, local, one_pass(local))
    stats = loader.dataset.stream.source.stats()
    loader.dataset.stream.close()
    assert len(proxy.requests(victim)) == 1 + FAST.max_retries  # every try on S3 was bad; the mirror's was good
    assert stats.fetches[victim] == 1


def test_hf_mirror_streams_the_same_batches_under_the_limit(corpus, tmp_path):
    from marin_data.testing.mirror import running_mirror

    import shutil

    root = tmp_path / "hub"
    shutil.copytree(corpus.root, root / "marin" / "remote", copy_function=os.link)
    limit = int(0.3 * corpus_decoded(corpus))
    config = one_pass_config(corpus)
    local = TokenStream(corpus, config, cache_dir=tmp_path / "local")
    with running_mirror(root) as mirror:
        loader = make_remote_loader("hf://datasets/marin/remote", config, cache_dir=tmp_path / "cache",
                                    cache_bytes=limit, policy=FAST, endpoint=mirror.url,
                                    manifest_sha256=corpus.manifest_sha256)
        assert stream_and_compare(loader, local, local.stop()) == local.stop()
        stats = loader.dataset.stream.source.stats()
        loader.dataset.stream.close()
    assert stats.high_water <= limit and dict(stats.fetches) == {s.path: 1 for s in corpus.shards}


def test_remote_state_resumes_on_a_local_copy_and_a_warm_cache_fetches_nothing(corpus, published, proxy,
                                                                               tmp_path):  # noqa: F811
    url, _ = published
    options = dict(cache_dir=tmp_path / "cache", cache_bytes=corpus_decoded(corpus), policy=FAST,
                   endpoint_url=proxy.endpoint)
    loader = make_remote_loader(url, CONFIG, **options)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    it.close()
    loader.dataset.stream.close()
    resumed = make_loader(corpus, CONFIG, cache_dir=tmp_path / "local", state=state)
    expected = next(iter(resumed))
    proxy.reset_counts()
    again = make_remote_loader(url, CONFIG, state=state, **options)  # the same cache directory: warm
    got = next(iter(again))
    stream = again.dataset.stream
    needed = [stream.shards[g].path for g in stream.shards_at(range(state["position"],
                                                                      state["position"] + CONFIG.batch_size))]
    stats = stream.source.stats()
    stream.close()
    np.testing.assert_array_equal(got["input_ids"].numpy(), expected["input_ids"].numpy())
    assert stats.hits >= len(needed) and not any(stats.fetches[p] for p in needed)
    assert not any(proxy.requests(p) for p in needed)  # the shards the batch read came from disk


def test_prepare_fetches_the_next_batch_s_shards_before_it_is_asked_for(corpus, published, moto,
                                                                        tmp_path):  # noqa: F811
    import time

    url, _ = published
    loader = make_remote_loader(url, CONFIG, cache_dir=tmp_path / "cache", cache_bytes=corpus_decoded(corpus),
                                policy=FAST, endpoint_url=moto)
    stream = loader.dataset.stream
    position = 40 * CONFIG.batch_size  # a resumed run's: the shards of position 0 are not the ones wanted
    loader.load_state_dict({**loader.state_dict(), "position": position})
    needed = [stream.shards[g] for g in stream.shards_at(range(position, position + CONFIG.batch_size))]
    assert not stream.source.ready(needed)
    loader.prepare()  # as the trainer does before it builds the model
    deadline = time.monotonic() + 60
    while not stream.source.ready(needed) and time.monotonic() < deadline:
        time.sleep(0.02)
    got = next(iter(loader))
    stats = stream.source.stats()
    stream.close()
    assert int(got["index"][0]) >= position
    assert stats.misses == 0 and stats.wait_seconds == 0  # the first batch waited for no shard


def test_a_limit_below_one_shard_is_refused_with_the_size_needed(corpus, published, tmp_path, moto):  # noqa: F811
    url, _ = published
    loader = make_remote_loader(url, CONFIG, cache_dir=tmp_path / "cache", cache_bytes=1000, policy=FAST,
                                endpoint_url=moto)
    with pytest.raises(LoaderConfigError, match="raise it"):
        next(iter(loader))
    loader.dataset.stream.close()


def test_a_mapped_shard_is_never_evicted_and_the_least_recently_used_free_one_is(corpus, tmp_path):
    import gc

    from marin_data.loader.remote.budget import _footprint
    from marin_data.loader.remote.cache import RemoteShardCache
    from marin_data.stores import open_store

    shards = corpus.shards[:4]
    decoded = max(decoded_bytes(s) for s in shards)
    room = max(_footprint(s) for s in shards) + decoded + decoded // 2  # one decode and one fetch, not two decodes
    with RemoteShardCache([open_store(corpus.root)], tmp_path / "cache", max_bytes=room, prefetch=0) as cache:
        held = cache.open(shards[0])  # mapped: pinned
        cache.open(shards[1])  # dropped at once: free
        cache.open(shards[2])  # must evict shards[1], the only unpinned one
        stats = cache.stats()
        assert stats.evictions == 1 and stats.high_water <= room
        np.testing.assert_array_equal(cache.open(shards[0]).tokens, held.tokens)  # still cached: no refetch
        assert cache.stats().fetches[shards[0].path] == 1
        with pytest.raises(LoaderConfigError, match="in use"):  # shards[0] and [2] mapped: no room for [3]
            pinned = cache.open(shards[2])
            cache.open(shards[3])
        del held, pinned
        gc.collect()
        cache.open(shards[3])  # now both are free again
        assert cache.stats().high_water <= room


def test_marin_train_cli_trains_checkpoints_and_resumes(corpus, tmp_path, capsys):
    from marin_data.cli import main

    args = ["train", "--data", str(corpus.root), "--steps", "3", "--batch-size", "2", "--seq-len", "32",
            "--checkpoint-dir", str(tmp_path / "run"), "--log-every", "1"]
    for until in ("2", "3"):
        with pytest.raises(SystemExit) as exit_:
            main([*args, "--until", until])
        assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "step     2/3" in out and "resumed from" in out and "step     3/3" in out and "done: step 3" in out
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == ["step-00000002", "step-00000003"]  # DCP dirs


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Four subsets of four shards of ~4.5k tokens."""
    return build_corpus(tmp_path_factory.mktemp("mixed") / "corpus", {n: [60] * 4 for n in "abcd"},
                        doc_tokens=(50, 100), seed=2)


def test_ranks_fetch_only_the_shards_their_rows_read_and_dealt_by_shard_far_fewer(mixed, bucket_url, moto,
                                                                                  tmp_path):  # noqa: F811
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(mixed.root, copy)
    publish(copy, to=bucket_url, endpoint_url=moto, progress=False)
    world = 4
    config = LoaderConfig(seq_len=32, batch_size=4, shuffle_window=1, val_fraction=0.01, mixture_block=16,
                          mixture={n: 1 for n in "abcd"})
    local = TokenStream(mixed, config, cache_dir=tmp_path / "local")
    steps = min(local.sizes().values()) * 4 // (world * config.batch_size)  # within every subset's first pass
    config = replace(config, mixture=[Phase({n: 1 for n in "abcd"}, steps * world * config.batch_size)])
    local = TokenStream(mixed, config, cache_dir=tmp_path / "local")
    fetched = {}
    for rank_rows in ("shard", "position"):
        # share=False: ranks as on four hosts, each fetching for itself (the next test shares one host's).
        loaders = [make_remote_loader(bucket_url, replace(config, rank_rows=rank_rows), rank=r, world_size=world,
                                      cache_dir=tmp_path / rank_rows, cache_bytes=corpus_decoded(mixed), policy=FAST,
                                      share=False, endpoint_url=moto) for r in range(world)]
        per_rank = [[{k: v.numpy() for k, v in batch.items()} for batch in loader] for loader in loaders]
        assert all(len(batches) == steps for batches in per_rank)
        check_global_stream(per_rank, 0, local.read(np.arange(steps * world * config.batch_size)),
                            stream=local if rank_rows == "shard" else None)
        fetched[rank_rows] = 0
        for loader, batches in zip(loaders, per_rank):
            stream = loader.dataset.stream
            assert stream.rank_rows == rank_rows and stream.source.root.name.endswith(f"-rank{loaders.index(loader)}")
            read = {stream.shards[g].path for b in batches for g in stream.shards_at(b["index"])}
            stats = stream.source.stats()
            stream.close()
            assert dict(stats.fetches) == {path: 1 for path in read}  # what its rows read, once: nothing else
            fetched[rank_rows] += len(read)
    assert fetched["position"] == world * len(mixed.shards)  # every rank fetches every shard
    # Equal weights and a global batch of one mixture block: each global batch holds exactly 4 rows of each
    # subset, so dealt by shard, rank r reads subset r only, and each shard is fetched once in all.
    assert fetched["shard"] == len(mixed.shards)


def test_make_loader_streams_an_s3_url_like_make_remote_loader(corpus, published, moto, tmp_path):  # noqa: F811
    url, _ = published
    loader = make_loader(url, CONFIG, cache_dir=tmp_path / "cache", cache_bytes=corpus_decoded(corpus),
                         policy=FAST, endpoint_url=moto)
    got = next(iter(loader))
    loader.dataset.stream.close()
    expected = next(iter(make_loader(corpus, CONFIG, cache_dir=tmp_path / "local")))
    np.testing.assert_array_equal(got["input_ids"].numpy(), expected["input_ids"].numpy())
    with pytest.raises(LoaderConfigError, match="remote corpus given for a local one"):
        make_loader(corpus, CONFIG, endpoint_url=moto)


def test_caches_of_one_host_fetch_a_shard_once_and_hard_link_it(corpus, published, proxy, tmp_path):  # noqa: F811
    from marin_data.loader.remote.cache import RemoteShardCache
    from marin_data.stores import open_store

    url, _ = published
    store = open_store(url, endpoint_url=proxy.endpoint)
    caches = [RemoteShardCache([store], tmp_path / f"rank{r}", max_bytes=corpus_decoded(corpus), prefetch=0,
                               policy=FAST, peers=tmp_path / "peers") for r in range(3)]
    first, second, third = corpus.shards[:3]
    try:
        a = caches[0].open(first)
        b = caches[1].open(first)  # linked from rank0's decode: no request
        assert np.array_equal(a.tokens, b.tokens)
        assert len(proxy.requests(first.path)) == 1
        assert caches[0].stats().fetches == {first.path: 1} and caches[1].stats().shared == 1
        tokens = [c._decoder.paths(first)[0] for c in caches[:2]]
        assert os.stat(tokens[0]).st_ino == os.stat(tokens[1]).st_ino  # one copy on disk
        # Three ranks wanting one shard at once: one fetch, two links.
        got = [None] * 3
        threads = [threading.Thread(target=lambda r=r: got.__setitem__(r, caches[r].open(second))) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(proxy.requests(second.path)) == 1 and all(g is not None for g in got)
        assert sum(c.stats().shared for c in caches) == 1 + 2
        # A peer's eviction leaves the others' links readable; without peers a cache fetches for itself.
        del a
        caches[0]._evict(caches[0]._entries[first.sha256])
        assert not tokens[0].exists() and np.array_equal(np.load(tokens[1], mmap_mode="r"), b.tokens)
        alone = RemoteShardCache([store], tmp_path / "alone", max_bytes=corpus_decoded(corpus), prefetch=0,
                                 policy=FAST)
        alone.open(third)
        caches[2].open(third)
        alone.close()
        assert len(proxy.requests(third.path)) == 2
    finally:
        for c in caches:
            c.close()


def test_ranks_of_one_host_dealt_by_position_fetch_each_shard_once_between_them(mixed, bucket_url, moto,
                                                                               tmp_path):  # noqa: F811
    import shutil

    shutil.copytree(mixed.root, tmp_path / "copy")
    publish(tmp_path / "copy", to=bucket_url, endpoint_url=moto, progress=False)
    config = LoaderConfig(seq_len=32, batch_size=4, shuffle_window=1, val_fraction=0.01, mixture_block=16,
                          mixture={n: 1 for n in "abcd"}, rank_rows="position")
    local = TokenStream(mixed, config, cache_dir=tmp_path / "local")
    steps = min(local.sizes().values()) * 4 // 16
    config = replace(config, mixture=[Phase({n: 1 for n in "abcd"}, steps * 16)])
    loaders = [make_remote_loader(bucket_url, config, rank=r, world_size=4, cache_dir=tmp_path / "cache",
                                  cache_bytes=corpus_decoded(mixed), policy=FAST, endpoint_url=moto) for r in range(4)]
    per_rank = [[{k: v.numpy() for k, v in batch.items()} for batch in loader] for loader in loaders]
    check_global_stream(per_rank, 0, TokenStream(mixed, config, cache_dir=tmp_path / "local").read(
        np.arange(steps * 16)))
    stats = [loader.dataset.stream.source.stats() for loader in loaders]
    for loader in loaders:
        loader.dataset.stream.close()
    fetched = sum((s.fetches for s in stats), Counter())
    assert fetched == {s.path: 1 for s in mixed.shards}  # every rank read every shard; the host fetched each once
    assert sum(s.shared for s in stats) == 3 * len(mixed.shards)
