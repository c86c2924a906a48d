"""A store that keeps failing is tried after the others (`marin_data.stores.order`).

The rules on their own, driven through the real retry helper over local stores; then a corpus served by
a Hub endpoint that drips every answer (tests/hostile.py) with a healthy local mirror: a download of a
subset and the loader's remote cache each cost the dripping store at most one file's retries, however
many files they read. A request is cut after a grace of 1 s here (60 s by default).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from conftest import build_corpus
from hostile import Hostility, HostileServer

from marin_data.errors import RemoteError, RetryableRemoteError, TooSlowError
from marin_data.loader import LoaderConfig
from marin_data.loader.remote.stream import make_remote_loader
from marin_data.retry import retry_call
from marin_data.stores import open_store
from marin_data.stores.order import StoreOrder
from marin_data.transfer.download import download
from marin_data.transfer.plan import DOWNLOAD_POLICY

POLICY = replace(DOWNLOAD_POLICY, max_retries=5, base_wait=0.01, max_wait=0.02)  # the default count of retries
BUDGET = 1 + POLICY.max_retries  # requests one file may cost a store: its retry budget


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def stores(tmp_path, n: int = 2):
    return [open_store(tmp_path / name) for name in ("primary", "mirror", "third")[:n]]


def fetch(order: StoreOrder, answers: dict[str, list]) -> tuple[str | None, list[str]]:
    """One file through ``order`` as every reader does: each store in turn under its policy. ``answers``
    holds each store's outcomes in turn (an error to raise, or None for a success); returns the store that
    served the file (None: none) and the store of every attempt."""
    tried: list[str] = []

    def attempt(name: str):
        tried.append(name)
        outcome = answers[name].pop(0) if answers[name] else None
        if outcome is not None:
            raise outcome

    for store, policy in order.tries(POLICY):
        name = store.root.name
        try:
            retry_call(lambda: attempt(name), policy=policy, what=name, sleep=lambda _: None)
            return name, tried
        except RemoteError:
            continue
    return None, tried


def slow(n: int) -> list:
    return [TooSlowError("too slow", path="x") for _ in range(n)]


def test_a_store_too_slow_k_times_in_a_row_goes_last_and_the_log_says_so_once(tmp_path, caplog):
    order = StoreOrder(stores(tmp_path), demote_after=3, cool_down=600, now=Clock())
    with caplog.at_level(logging.WARNING, logger="marin_data.stores.order"):
        served, tried = fetch(order, {"primary": slow(100), "mirror": []})
        assert (served, tried) == ("mirror", ["primary"] * 3 + ["mirror"])  # not its 6 tries
        for _ in range(10):
            assert fetch(order, {"primary": slow(100), "mirror": []}) == ("mirror", ["mirror"])
    demoted = [r for r in caplog.records if r.name == "marin_data.stores.order"]
    assert len(demoted) == 1 and "primary" in demoted[0].getMessage()
    assert "3 requests in a row were too slow" in demoted[0].getMessage()


def test_a_store_that_spends_its_retries_on_a_file_goes_last(tmp_path):
    order = StoreOrder(stores(tmp_path), demote_after=3, now=Clock())
    reset = [RetryableRemoteError("reset", path="x") for _ in range(BUDGET)]  # fails, never too slow
    assert fetch(order, {"primary": reset, "mirror": []}) == ("mirror", ["primary"] * BUDGET + ["mirror"])
    assert fetch(order, {"primary": [], "mirror": []}) == ("mirror", ["mirror"])


def test_a_success_between_slow_requests_keeps_the_store_first(tmp_path):
    order = StoreOrder(stores(tmp_path), demote_after=3, now=Clock())
    for _ in range(5):
        assert fetch(order, {"primary": slow(2), "mirror": []}) == ("primary", ["primary"] * 3)


def test_a_demoted_store_is_tried_when_the_mirror_fails_and_first_again_after_its_cool_down(tmp_path):
    clock = Clock()
    order = StoreOrder(stores(tmp_path), demote_after=2, cool_down=100, now=clock)
    fetch(order, {"primary": slow(2), "mirror": []})
    # The mirror lacks a file: the demoted primary serves it, with its retries for failures other than slowness
    gone = RemoteError("not found", path="x", status=404)
    reset = [RetryableRemoteError("reset", path="x")]
    assert fetch(order, {"primary": reset, "mirror": [gone]}) == ("primary", ["mirror", "primary", "primary"])
    # ... but a request too slow again ends its turn at once.
    assert fetch(order, {"primary": slow(9), "mirror": [gone]}) == (None, ["mirror", "primary"])
    clock.t = 99
    assert fetch(order, {"primary": [], "mirror": []}) == ("mirror", ["mirror"])
    clock.t = 100  # the cool-down is over: the primary is tried first again, on trial
    assert fetch(order, {"primary": slow(1), "mirror": []}) == ("mirror", ["primary", "mirror"])
    clock.t = 299  # it failed its trial: demoted for twice as long
    assert fetch(order, {"primary": [], "mirror": []}) == ("mirror", ["mirror"])
    clock.t = 300
    assert fetch(order, {"primary": [], "mirror": []}) == ("primary", ["primary"])
    assert fetch(order, {"primary": slow(1), "mirror": []}) == ("primary", ["primary"] * 2)  # healthy again


def test_the_order_among_healthy_and_among_demoted_stores_is_the_given_one(tmp_path):
    order = StoreOrder(stores(tmp_path, 3), demote_after=1, now=Clock())
    assert fetch(order, {"primary": slow(1), "mirror": slow(1), "third": []}) == ("third",
                                                                                 ["primary", "mirror", "third"])
    assert [s.root.name for s, _ in order.tries(POLICY)] == ["third", "primary", "mirror"]
    wrapped = order.using(lambda s: open_store(s.root))  # as `versioned` wraps them: the same health
    assert [s.root.name for s, _ in wrapped.tries(POLICY)] == ["third", "primary", "mirror"]


def test_a_run_with_one_store_keeps_its_retries(tmp_path):
    order = StoreOrder(stores(tmp_path, 1), demote_after=1, now=Clock())
    for _ in range(2):
        assert fetch(order, {"primary": slow(BUDGET)}) == (None, ["primary"] * BUDGET)


# --- a dripping Hub endpoint with a healthy mirror ------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A subset of 12 shards, and another that is not asked for."""
    return build_corpus(tmp_path_factory.mktemp("order") / "c", {"code": [20] * 12, "prose": [20] * 2},
                        doc_tokens=(5, 30), seed=3)


@pytest.fixture
def dripping(corpus, monkeypatch):
    monkeypatch.setenv("MARIN_REQUEST_GRACE_SECONDS", "1")
    with HostileServer(corpus.root) as srv:
        yield srv


@pytest.mark.parametrize("match", ["", "data/"], ids=["every-answer", "shards-only"])
def test_a_download_from_a_dripping_store_costs_it_one_file_s_retries_at_most(corpus, dripping, tmp_path,
                                                                            match):
    dripping.hostility = Hostility("drip", match=match)
    report = download(dripping.hub_url, subsets=["code"], dest=tmp_path / "d", mirrors=[str(corpus.root)],
                      endpoint=dripping.endpoint, policy=POLICY, workers=3, progress=False)
    shards = [s.path for s in corpus.shards if s.subset == "code"]
    assert report.ok and len(shards) >= 10 and set(shards) <= set(report.fetched)
    for path in shards:
        assert (tmp_path / "d" / path).read_bytes() == (corpus.root / path).read_bytes()
    assert dripping.hostile <= BUDGET  # today: every file spends its retries on it, then the mirror serves it


def test_the_loader_s_remote_cache_costs_a_dripping_store_one_file_s_retries_at_most(corpus, dripping, tmp_path):
    dripping.hostility = Hostility("drip", match="")
    config = LoaderConfig(seq_len=8, batch_size=4, subsets=["code"], shuffle_window=1)
    loader = make_remote_loader(dripping.hub_url, config, mirrors=[str(corpus.root)], endpoint=dripping.endpoint,
                                cache_dir=tmp_path / "cache", policy=POLICY, fetch_workers=2)
    try:
        stream = loader.dataset.stream
        for n, batch in enumerate(loader):  # a pass reads every shard; stop once 10 were fetched
            assert tuple(batch["input_ids"].shape) == (4, 8)
            if len(stream.source.stats().fetches) >= 10 or n == 10_000:
                break
        fetched = stream.source.stats().fetches
    finally:
        loader.dataset.stream.close()
    assert len(fetched) >= 10
    assert dripping.hostile <= BUDGET  # today: every shard spends its retries on it, then the mirror serves it


def test_a_file_whose_lookup_drips_is_named_in_the_error_and_the_retry_log(dripping, caplog):
    dripping.hostility = Hostility("drip", match="manifest.json")  # read to find the repo that holds a file
    store = open_store(dripping.hub_url, endpoint=dripping.endpoint)
    wanted = store.describe("shards.parquet")
    with caplog.at_level(logging.WARNING, logger="marin_data.retry"), pytest.raises(TooSlowError) as info:
        retry_call(lambda: store.read_bytes("shards.parquet", limit=1 << 20), policy=replace(POLICY, max_retries=1),
                   what=wanted)
    assert info.value.path == wanted and str(info.value).startswith(f"{wanted}: too slow: ")
    assert f"while reading {store.describe('manifest.json')} to locate it" in info.value.message
    assert f"{wanted}: too slow: " in caplog.text and f"{wanted}: {store.describe('manifest.json')}" not in caplog.text


def test_a_download_of_an_unpinned_levanter_store_costs_a_dripping_store_one_file_s_retries_at_most(
        tmp_path, monkeypatch):
    from levanter_env import make_store

    from marin_data.levanter import detect
    from marin_data.levanter.download import download_cache

    monkeypatch.setenv("MARIN_REQUEST_GRACE_SECONDS", "1")
    make_store(tmp_path / "store", {"cluster=0/quality=4": 300, "cluster=1/quality=4": 200})
    with HostileServer(tmp_path / "store") as srv:
        srv.hostility = Hostility("drip", match="/input_ids/data/c/")  # the data chunk files; the ledgers are read
        done = download_cache(detect(srv.hub_url, endpoint=srv.endpoint), subsets=None, dest=tmp_path / "d",
                              mirrors=[str(tmp_path / "store")], policy=POLICY, workers=3, progress=False,
                              endpoint=srv.endpoint)
    assert done.ok and sum("/input_ids/data/c/" in f.path for f in done.transfer.plan.files) >= 2
    assert srv.hostile <= BUDGET
