"""download through a fault-injecting proxy: every fault a download must survive, a dead mirror, and kill -9 mid-run.

End state checked in every case: each requested file verified or reported failed, nothing wrong under a
final name, and no byte of a finished file fetched twice (the proxy counts bytes served per object).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from s3_env import (  # noqa: F401 - fixtures
    FAST, bucket_url, fault_corpus, interrupt_download, kill_and_resume, moto, object_key, proxy,
    published, run_cli)
from faultproxy import Fault

from marin_data.corpus.record import read_download_record
from marin_data.corpus.verify import verify_corpus
from marin_data.layout import PARTIAL_SUFFIX
from marin_data.stores.base import READ_CHUNK
from marin_data.transfer.download import download


def _check_end_state(dest: Path, corpus, subsets: list[str], failed: set[str] = frozenset()) -> None:
    wanted = [s for s in corpus.shards if s.subset in subsets]
    for s in wanted:
        final = dest / s.path
        assert final.exists() != (s.path in failed), s.path
    report = verify_corpus(dest, subsets=subsets)
    assert {p.path for p in report.problems} == set(failed), report.problems  # failed ones: missing, no more


def _served_once(proxy, url: str, corpus, subsets: list[str], except_path: str | None = None) -> None:
    for s in corpus.shards:
        if s.subset in subsets and s.path != except_path:
            assert proxy.served[object_key(url, s.path)] == s.bytes, s.path


def _largest(corpus, subset: str):
    return max((s for s in corpus.shards if s.subset == subset), key=lambda s: s.bytes)


def test_a_dropped_connection_resumes_from_the_bytes_already_written(published, proxy, fault_corpus, tmp_path):
    url, _ = published
    shard = _largest(fault_corpus, "b")
    proxy.add(Fault("drop", match=shard.path, fraction=0.8))
    report = download(url, subsets=["b"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok
    first, second = proxy.requests(shard.path)
    assert first.range is None and second.range.startswith("bytes=") and second.range != "bytes=0-"
    resumed_at = int(second.range.removeprefix("bytes=").rstrip("-"))
    sent_before_drop = int(shard.bytes * 0.8)
    # The client keeps what it received, less at most the one read the drop interrupted.
    assert 0 < resumed_at <= sent_before_drop < resumed_at + READ_CHUNK
    assert proxy.served[object_key(url, shard.path)] == sent_before_drop + shard.bytes - resumed_at
    _check_end_state(tmp_path / "d", fault_corpus, ["b"])
    _served_once(proxy, url, fault_corpus, ["b"], except_path=shard.path)


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_waits_for_retry_after_and_then_succeeds(published, proxy, fault_corpus, tmp_path, status,
                                                            caplog):
    url, _ = published
    shard = _largest(fault_corpus, "a")
    proxy.add(Fault("status", match=shard.path, status=status, retry_after="0.3", times=2))
    with caplog.at_level(logging.WARNING, logger="marin_data.retry"):
        report = download(url, subsets=["a"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok
    assert [r.status for r in proxy.requests(shard.path)] == [status, status, 200]
    # The server's 0.3 s, not the policy's 0.01-0.02 s backoff (both under max_retry_after=0.5).
    assert "Retrying in 0.3s [1/3]" in caplog.text and "Retrying in 0.3s [2/3]" in caplog.text
    _check_end_state(tmp_path / "d", fault_corpus, ["a"])
    _served_once(proxy, url, fault_corpus, ["a"])


def test_a_500_is_retried_with_backoff(published, proxy, fault_corpus, tmp_path):
    url, _ = published
    shard = _largest(fault_corpus, "a")
    proxy.add(Fault("status", match=shard.path, status=500))
    report = download(url, subsets=["a"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok and [r.status for r in proxy.requests(shard.path)] == [500, 200]
    _served_once(proxy, url, fault_corpus, ["a"])


def test_a_truncated_body_resumes_with_range(published, proxy, fault_corpus, tmp_path):
    url, _ = published
    shard = _largest(fault_corpus, "a")
    proxy.add(Fault("truncate", match=shard.path, fraction=0.5))
    report = download(url, subsets=["a"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok
    assert [r.range for r in proxy.requests(shard.path)] == [None, f"bytes={int(shard.bytes * 0.5)}-"]
    _served_once(proxy, url, fault_corpus, ["a"])  # half, then the other half: each byte once
    _check_end_state(tmp_path / "d", fault_corpus, ["a"])


def test_a_corrupted_body_is_discarded_and_fetched_again(published, proxy, fault_corpus, tmp_path):
    url, _ = published
    shard = _largest(fault_corpus, "a")
    proxy.add(Fault("corrupt", match=shard.path))
    report = download(url, subsets=["a"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok and proxy.served[object_key(url, shard.path)] == 2 * shard.bytes
    _check_end_state(tmp_path / "d", fault_corpus, ["a"])
    _served_once(proxy, url, fault_corpus, ["a"], except_path=shard.path)


def _seed_partial(dest: Path, src: Path, path: str, prefix: bytes) -> int:
    partial = dest / (path + PARTIAL_SUFFIX)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(prefix)
    return len(prefix)


def test_a_200_to_a_range_request_restarts_the_file_from_that_body(published, proxy, fault_corpus, tmp_path):
    url, src = published
    shard = _largest(fault_corpus, "a")
    have = _seed_partial(tmp_path / "d", src, shard.path, (src / shard.path).read_bytes()[:100_000])
    proxy.add(Fault("ignore_range", match=shard.path))
    report = download(url, subsets=["a"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok
    (req,) = proxy.requests(shard.path)
    assert req.range == f"bytes={have}-" and req.status == 200
    assert proxy.served[object_key(url, shard.path)] == shard.bytes  # the 200 body was used, not fetched again
    _check_end_state(tmp_path / "d", fault_corpus, ["a"])


def test_a_partial_file_with_a_bad_prefix_is_discarded_and_fetched_whole(published, proxy, fault_corpus,
                                                                         tmp_path):
    url, src = published
    shard = _largest(fault_corpus, "a")
    have = _seed_partial(tmp_path / "d", src, shard.path, b"\0" * 100_000)
    report = download(url, subsets=["a"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert report.ok
    assert [r.range for r in proxy.requests(shard.path)] == [f"bytes={have}-", None]
    _check_end_state(tmp_path / "d", fault_corpus, ["a"])


def test_a_store_that_keeps_failing_is_reported_and_a_mirror_takes_over(published, proxy, fault_corpus,
                                                                        tmp_path):
    url, src = published
    shard = _largest(fault_corpus, "b")
    proxy.add(Fault("status", match=shard.path, status=503, times=1000))
    report = download(url, subsets=["b"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST)
    assert [p for p, _ in report.failed] == [shard.path] and "503" in report.failed[0][1]
    assert len(proxy.requests(shard.path)) == FAST.max_retries + 1  # bounded
    assert shard.path in str(report.error()) and report.error().failures == list(report.failed)
    assert read_download_record(tmp_path / "d").subsets == ()  # b is incomplete: not recorded
    _check_end_state(tmp_path / "d", fault_corpus, ["b"], failed={shard.path})
    _served_once(proxy, url, fault_corpus, ["b"], except_path=shard.path)

    proxy.reset_counts()
    again = download(url, subsets=["b"], dest=tmp_path / "d", mirrors=[str(src)], endpoint_url=proxy.endpoint,
                     policy=FAST)
    assert again.ok and again.fetched == (shard.path,)
    assert read_download_record(tmp_path / "d").subsets == ("b",)
    assert not [k for k, n in proxy.served.items() if "/data/" in k and n]  # finished files: not again
    _check_end_state(tmp_path / "d", fault_corpus, ["b"])


@pytest.mark.slow
def test_ctrl_c_stops_promptly_and_keeps_the_partial_file(published, proxy, fault_corpus, tmp_path):
    url, _ = published
    code, seen = interrupt_download([url, "--endpoint-url", proxy.endpoint], proxy, tmp_path / "d",
                                    fault_corpus.shards, signal.SIGINT)
    assert code == 130, seen
    (partial,) = [p for p in (tmp_path / "d").rglob(f"*{PARTIAL_SUFFIX}") if p.stat().st_size > 0]
    assert not partial.with_name(partial.name.removesuffix(PARTIAL_SUFFIX)).exists()


@pytest.mark.slow
def test_kill_9_mid_run_then_rerun_resumes_without_refetching_finished_files(published, proxy, fault_corpus,
                                                                             tmp_path):
    url, _ = published
    dest = tmp_path / "d"
    shards = list(fault_corpus.shards)
    kill_and_resume([url, "--endpoint-url", proxy.endpoint], proxy, dest, shards,
                    lambda: download(url, subsets=None, dest=dest, endpoint_url=proxy.endpoint, policy=FAST))
    _check_end_state(dest, fault_corpus, ["a", "b"])


def test_cli_exits_1_listing_every_failed_file(published, proxy, fault_corpus, tmp_path):
    url, _ = published
    b = [s.path for s in fault_corpus.shards if s.subset == "b"]
    for path in b:  # Retry-After: 0 keeps the CLI's default retries instant
        proxy.add(Fault("status", match=path, status=503, retry_after="0", times=1000))
    done = run_cli("download", url, "--subset", "b", "--to", str(tmp_path / "d"), "--endpoint-url", proxy.endpoint)
    assert done.returncode == 1, done.stderr
    assert "INCOMPLETE" in done.stdout and all(p in done.stderr for p in b) and "run the same command" in done.stderr
    assert "Retrying in 0.0s [5/5]" in done.stderr
    assert not any((tmp_path / "d" / p).exists() for p in b)
