"""Few large files: download fetches each as parallel byte ranges, resumable range by range.

The fault corpus's shards are 1.3-2.7 MB, so `part_bytes` is shrunk to 256 KiB: subset "b" (two shards)
with 8 workers fetches each shard as 4 ranges. Every test ends verified, with each range's bytes served
once unless a fault forced more, through the counting fault proxy in front of moto.
"""

from __future__ import annotations

import json
import re

import pytest
from faultproxy import Fault
from s3_env import (  # noqa: F401 - fixtures
    FAST, bucket_url, copy_corpus, fault_corpus, moto, object_key, proxy, published, run_cli)

from marin_data.corpus.verify import verify_corpus
from marin_data.layout import PARTIAL_SUFFIX, RANGES_SUFFIX
from marin_data.retry import RetryPolicy
from marin_data.stores import open_store
from marin_data.stores.base import range_header
from marin_data.transfer.download import download
from marin_data.transfer.publish_s3 import publish

PART = 256 << 10


def _shards(corpus, subset="b"):
    return [s for s in corpus.shards if s.subset == subset]


def _spans(proxy, path: str) -> list[tuple[int, int]]:
    """The byte ranges [lo, hi) the client asked for, in order of request."""
    out = []
    for r in proxy.requests(path):
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", r.range or "")
        assert m, f"not a bounded range request: {r.range!r}"
        out.append((int(m[1]), int(m[2]) + 1))
    return out


def _verified(dest, corpus, subset="b") -> None:
    report = verify_corpus(dest, subsets=[subset])
    assert not report.problems, report.problems
    assert not list(dest.rglob(f"*{PARTIAL_SUFFIX}")) and not list(dest.rglob(f"*{RANGES_SUFFIX}"))
    for s in _shards(corpus, subset):
        assert (dest / s.path).stat().st_size == s.bytes


def _download(url, proxy, dest, **kwargs):
    return download(url, subsets=["b"], dest=dest, endpoint_url=proxy.endpoint, policy=kwargs.pop("policy", FAST),
                    workers=8, part_bytes=PART, **kwargs)


def test_range_header_asks_for_the_half_open_span():
    assert range_header(0, None) is None
    assert range_header(10, None) == "bytes=10-"
    assert range_header(0, 100) == "bytes=0-99"


def test_a_local_store_reads_just_the_span(fault_corpus):  # noqa: F811
    shard = _shards(fault_corpus)[0]
    with open_store(fault_corpus.root).read(shard.path, start=1000, end=1_500_000) as stream:
        data = b"".join(stream)
    assert data == (fault_corpus.root / shard.path).read_bytes()[1000:1_500_000]


def test_few_large_files_come_as_parallel_ranges_that_tile_each_file_once(published, proxy, fault_corpus,
                                                                          tmp_path):  # noqa: F811
    url, _ = published
    report = _download(url, proxy, tmp_path / "d")
    assert report.ok
    for s in _shards(fault_corpus):
        spans = sorted(_spans(proxy, s.path))
        assert len(spans) == 4  # 8 workers over 2 files: 4 ranges each, of a quarter (> PART) of the file
        assert spans[0][0] == 0 and spans[-1][1] == s.bytes
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
        assert proxy.served[object_key(url, s.path)] == s.bytes
    _verified(tmp_path / "d", fault_corpus)


@pytest.mark.parametrize("workers, part_bytes", [(2, PART), (8, 0)])
def test_as_many_large_files_as_workers_or_part_0_come_with_one_get_each(published, proxy, fault_corpus, tmp_path,
                                                                        workers, part_bytes):  # noqa: F811
    url, _ = published
    assert download(url, subsets=["b"], dest=tmp_path / "d", endpoint_url=proxy.endpoint, policy=FAST,
                    workers=workers, part_bytes=part_bytes).ok
    assert all(r.range is None for s in _shards(fault_corpus) for r in proxy.requests(s.path))


def test_a_dropped_range_resumes_where_it_stopped(published, proxy, fault_corpus, tmp_path):  # noqa: F811
    url, _ = published
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    proxy.add(Fault("drop", match=shard.path, fraction=0.5))
    assert _download(url, proxy, tmp_path / "d").ok
    spans = _spans(proxy, shard.path)
    assert len(spans) == 5  # four ranges, one of them dropped and asked again from where it stopped
    resumed = spans[-1]
    first = next(s for s in spans[:4] if s[1] == resumed[1])
    assert first[0] < resumed[0] < resumed[1]
    # Bytes served twice: at most the one read the drop interrupted.
    assert shard.bytes <= proxy.served[object_key(url, shard.path)] < shard.bytes + (1 << 20)
    _verified(tmp_path / "d", fault_corpus)


def test_a_200_to_a_range_is_cut_to_its_range(published, proxy, fault_corpus, tmp_path):  # noqa: F811
    url, _ = published
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    proxy.add(Fault("ignore_range", match=shard.path))
    assert _download(url, proxy, tmp_path / "d").ok
    assert len(proxy.requests(shard.path)) == 4  # the whole-object answer served its range, no retry
    assert [r.status for r in proxy.requests(shard.path)].count(200) == 1
    _verified(tmp_path / "d", fault_corpus)


def test_a_corrupted_range_fails_the_digest_and_the_file_is_fetched_again(published, proxy, fault_corpus,
                                                                          tmp_path):  # noqa: F811
    url, _ = published
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    proxy.add(Fault("corrupt", match=shard.path))
    assert _download(url, proxy, tmp_path / "d").ok
    assert len(proxy.requests(shard.path)) == 8 and proxy.served[object_key(url, shard.path)] == 2 * shard.bytes
    _verified(tmp_path / "d", fault_corpus)


def test_a_failed_ranged_download_resumes_each_range_from_its_record(published, proxy, fault_corpus, tmp_path):  # noqa: F811
    url, _ = published
    dest = tmp_path / "d"
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    proxy.add(Fault("drop", match=shard.path, fraction=0.5, times=100))
    report = _download(url, proxy, dest, policy=RetryPolicy(max_retries=0, base_wait=0, max_wait=0))
    assert [p for p, _ in report.failed] == [shard.path]
    record = json.loads((dest / (shard.path + RANGES_SUFFIX)).read_bytes())
    kept = sum(record["done"])
    assert 0 < kept < shard.bytes and record["sha256"] == shard.sha256
    served_before = proxy.served[object_key(url, shard.path)]
    proxy.clear()
    proxy.reset_counts()
    assert _download(url, proxy, dest).ok
    assert proxy.served[object_key(url, shard.path)] == shard.bytes - kept  # only what the ranges still lacked
    assert served_before >= kept
    _verified(dest, fault_corpus)


def test_a_one_get_partial_becomes_the_first_ranges_done(published, proxy, fault_corpus, tmp_path):  # noqa: F811
    url, src = published
    dest = tmp_path / "d"
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    have = 600_000
    partial = dest / (shard.path + PARTIAL_SUFFIX)
    partial.parent.mkdir(parents=True)
    partial.write_bytes((src / shard.path).read_bytes()[:have])
    assert _download(url, proxy, dest).ok
    assert proxy.served[object_key(url, shard.path)] == shard.bytes - have
    assert min(lo for lo, _ in _spans(proxy, shard.path)) >= have
    _verified(dest, fault_corpus)


def test_a_record_of_another_file_counts_nothing(published, proxy, fault_corpus, tmp_path):  # noqa: F811
    url, src = published
    dest = tmp_path / "d"
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    partial = dest / (shard.path + PARTIAL_SUFFIX)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * shard.bytes)
    (dest / (shard.path + RANGES_SUFFIX)).write_text(json.dumps(
        {"sha256": "0" * 64, "bytes": shard.bytes, "bounds": [0, shard.bytes], "done": [shard.bytes]}))
    assert _download(url, proxy, dest).ok
    assert proxy.served[object_key(url, shard.path)] == shard.bytes  # fetched whole, once: the zeros were never hashed
    _verified(dest, fault_corpus)


def test_ranges_from_a_hugging_face_mirror(fault_corpus, tmp_path):  # noqa: F811
    from faultproxy import FaultProxy

    from marin_data.testing.mirror import running_mirror
    from marin_data.transfer.publish_hf import publish_hf

    (tmp_path / "mirror").mkdir()
    with running_mirror(tmp_path / "mirror", writable=True, token="t") as mirror:
        publish_hf(copy_corpus(fault_corpus, tmp_path / "src"), to="hf://datasets/team/c", endpoint=mirror.url,
                   token="t", progress=False)
        with FaultProxy(mirror.url) as hop:
            hop.add(Fault("drop", match=_shards(fault_corpus)[1].path, fraction=0.5))
            report = download("hf://datasets/team/c", subsets=["b"], dest=tmp_path / "d", endpoint=hop.endpoint,
                              policy=FAST, workers=8, part_bytes=PART, progress=False)
            assert report.ok
            for s in _shards(fault_corpus):
                gets = [r for r in hop.requests(s.path) if r.range]
                assert len(gets) >= 4 and all(re.fullmatch(r"bytes=\d+-\d+", r.range) for r in gets)
    _verified(tmp_path / "d", fault_corpus)


def test_the_cli_takes_the_range_size_in_mib(published, proxy, fault_corpus, tmp_path):  # noqa: F811
    url, _ = published
    big = max(_shards(fault_corpus), key=lambda s: s.bytes)
    assert big.bytes >= 2 << 20
    out = run_cli("download", url, "--subset", "b", "--to", str(tmp_path / "d"), "--endpoint-url", proxy.endpoint,
                  "--part-mb", "1")
    assert out.returncode == 0, out.stderr
    spans = sorted(_spans(proxy, big.path))
    assert spans == [(lo, min(lo + (1 << 20), big.bytes)) for lo in range(0, big.bytes, 1 << 20)]  # 1 MiB ranges
    _verified(tmp_path / "d", fault_corpus)


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """One shard of ~48 MB: three ranges of 16 MiB, each recorded every 8 MiB (`partial.RECORD_EVERY`)."""
    from conftest import build_corpus

    return build_corpus(tmp_path_factory.mktemp("big") / "corpus", {"big": [36_000]}, doc_tokens=(900, 1100), seed=5)


def test_kill_9_mid_range_then_rerun_fetches_only_what_the_ranges_lacked(big_corpus, moto, bucket_url, proxy,
                                                                         tmp_path):  # noqa: F811
    import os
    import signal
    import subprocess
    import sys
    import time

    from s3_env import ROOT

    from marin_data.testing.local_s3 import LOCAL_S3_ENV

    (shard,) = big_corpus.shards
    assert shard.bytes > 2 * (16 << 20)
    publish(copy_corpus(big_corpus, tmp_path / "src"), to=bucket_url, endpoint_url=moto)
    dest = tmp_path / "d"
    record = dest / (shard.path + RANGES_SUFFIX)
    proxy.add(Fault("slow", match="/data/", times=100, delay=0.004))
    proc = subprocess.Popen([sys.executable, "-m", "marin_data", "download", bucket_url, "--subset", "big", "--to",
                             str(dest), "--endpoint-url", proxy.endpoint, "--part-mb", "16"], cwd=ROOT,
                            env={**os.environ, **LOCAL_S3_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if 0 < sum(json.loads(record.read_bytes())["done"]):  # a range has recorded its first 8 MiB
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        assert proc.poll() is None, "the download finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    proxy.wait_idle()
    kept = sum(json.loads(record.read_bytes())["done"])
    assert 0 < kept < shard.bytes
    proxy.clear()
    proxy.reset_counts()
    report = download(bucket_url, subsets=["big"], dest=dest, endpoint_url=proxy.endpoint, policy=FAST,
                      part_bytes=16 << 20, progress=False)
    assert report.ok
    assert proxy.served[object_key(bucket_url, shard.path)] == shard.bytes - kept
    _verified(dest, big_corpus, "big")


@pytest.mark.parametrize("record", ['[1, 2]', '{"sha256": 5}', '{"bounds": [0, "x"], "done": [1]}', "not json"])
def test_a_damaged_record_counts_nothing_and_the_file_is_fetched_whole(published, proxy, fault_corpus, tmp_path,
                                                                       record):  # noqa: F811
    url, _ = published
    dest = tmp_path / "d"
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    (dest / shard.path).parent.mkdir(parents=True)
    (dest / (shard.path + RANGES_SUFFIX)).write_text(record)
    assert _download(url, proxy, dest).ok
    assert proxy.served[object_key(url, shard.path)] == shard.bytes
    _verified(dest, fault_corpus)


def test_ranges_a_store_keeps_failing_are_finished_from_a_mirror(published, proxy, fault_corpus, tmp_path):  # noqa: F811
    url, src = published
    shard = max(_shards(fault_corpus), key=lambda s: s.bytes)
    proxy.add(Fault("drop", match=shard.path, fraction=0.5, times=100))
    report = download(url, subsets=["b"], dest=tmp_path / "d", mirrors=[str(src)], endpoint_url=proxy.endpoint,
                      policy=FAST, workers=8, part_bytes=PART, progress=False)
    assert report.ok
    # Each of the four ranges was tried 1 + max_retries times on S3, keeping what arrived; the local mirror
    # finished them: S3 never served the whole file, yet nothing was discarded.
    assert len(proxy.requests(shard.path)) == 4 * (1 + FAST.max_retries)
    assert proxy.served[object_key(url, shard.path)] < shard.bytes
    _verified(tmp_path / "d", fault_corpus)
