"""The one retry helper: bounded, jittered backoff, Retry-After, what is and is not retried."""

from __future__ import annotations

import logging

import pytest

from marin_data.errors import RemoteError, RetryableRemoteError
from marin_data.retry import RetryPolicy, parse_retry_after, retry_call, status_error


def _failing(errors: list[BaseException]):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "done"

    return fn, calls


def test_retries_transient_errors_and_logs_each_wait(caplog):
    waits: list[float] = []
    fn, calls = _failing([RetryableRemoteError("reset", path="p")] * 2)
    with caplog.at_level(logging.WARNING, logger="marin_data.retry"):
        assert retry_call(fn, policy=RetryPolicy(jitter=0), what="GET x", sleep=waits.append) == "done"
    assert len(calls) == 3 and waits == [1.0, 2.0]
    assert "GET x: p: reset. Retrying in 1.0s [1/5]" in caplog.text and "Retrying in 2.0s [2/5]" in caplog.text


def test_gives_up_after_max_retries_with_the_last_error():
    fn, calls = _failing([RetryableRemoteError(f"try {i}") for i in range(10)])
    with pytest.raises(RetryableRemoteError, match="try 3"):
        retry_call(fn, policy=RetryPolicy(max_retries=3), sleep=lambda s: None)
    assert len(calls) == 4


def test_backoff_doubles_up_to_max_wait_and_jitter_only_shortens_it():
    policy = RetryPolicy(base_wait=1, max_wait=8, jitter=0.5)
    for retry, cap in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 8), (9, 8)]:
        for _ in range(50):
            assert cap * 0.5 <= policy.wait(retry) <= cap


def test_retry_after_is_obeyed_up_to_its_cap():
    policy = RetryPolicy(max_retry_after=10)
    assert policy.wait(1, RetryableRemoteError("slow down", status=429, retry_after=3.0)) == 3.0
    assert policy.wait(1, RetryableRemoteError("slow down", status=503, retry_after=3600)) == 10
    assert parse_retry_after("7") == 7.0 and parse_retry_after("0.25") == 0.25
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: now
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_final_errors_and_unlisted_statuses_are_not_retried():
    for err in [RemoteError("forbidden", status=403), ValueError("bug"),
                RetryableRemoteError("bad gateway", status=502)]:
        fn, calls = _failing([err])
        with pytest.raises(type(err)):
            retry_call(fn, policy=RetryPolicy(retry_statuses=frozenset({503})), sleep=lambda s: None)
        assert len(calls) == 1


@pytest.mark.parametrize("status,retryable", [(None, True), (429, True), (500, True), (503, True), (504, True),
                                              (400, False), (403, False), (404, False), (416, False)])
def test_status_error_types(status, retryable):
    err = status_error("x", status=status, path="s3://b/k", retry_after=1.5)
    assert isinstance(err, RetryableRemoteError) == retryable and isinstance(err, RemoteError)
    assert (err.status, err.retry_after, err.path) == (status, 1.5, "s3://b/k")


def test_marin_data_imports_boto3_only_inside_the_s3_store():
    import subprocess
    import sys

    code = ("import sys, marin_data.transfer.download, marin_data.transfer.publish_s3, marin_data.transfer.remote_verify, marin_data.stores.local, "
            "marin_data.cli.download, marin_data.cli.publish; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
