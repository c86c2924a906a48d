"""What a store's answers may cost: a listing's entries and bytes over all its pages, a request's time."""

from __future__ import annotations

import time

import pytest

from marin_data.errors import RemoteLimitError, RetryableRemoteError
from marin_data.stores.base import ReadStream
from marin_data.stores.limits import PAGE_MIN_BYTES, ListingBudget, RequestClock


def test_a_listing_is_bounded_over_its_pages_and_an_empty_page_still_counts(monkeypatch):
    monkeypatch.setenv("MARIN_LIST_MAX_ENTRIES", "10")
    monkeypatch.setenv("MARIN_LIST_MAX_BYTES", str(4 * PAGE_MIN_BYTES))
    budget = ListingBudget("hf://datasets/o/n")
    budget.take(entries=6, nbytes=100, page=True)
    with pytest.raises(RemoteLimitError, match="more than 10 entries") as info:
        budget.take(entries=5, nbytes=100, page=True)
    assert info.value.path == "hf://datasets/o/n"
    empty = ListingBudget("hf://datasets/o/n")
    with pytest.raises(RemoteLimitError, match=f"more than {4 * PAGE_MIN_BYTES:,} bytes"):
        for _ in range(5):  # a server paging empty answers runs out too
            empty.take(entries=0, nbytes=2, page=True)


def test_a_request_gets_its_grace_plus_a_second_per_floor_of_bytes(monkeypatch):
    monkeypatch.setenv("MARIN_REQUEST_GRACE_SECONDS", "10")
    monkeypatch.setenv("MARIN_FLOOR_BYTES_PER_SECOND", "1000")
    clock = RequestClock("s3://b/x")
    assert 9 < clock.remaining() <= 10
    clock.got(5000)
    assert 14 < clock.remaining() <= 15


def test_a_body_dripping_below_the_floor_is_cut_and_retryable(monkeypatch):
    monkeypatch.setenv("MARIN_REQUEST_GRACE_SECONDS", "0.3")
    monkeypatch.setenv("MARIN_FLOOR_BYTES_PER_SECOND", "1000")

    def drip():
        for _ in range(500):  # 10 s: ends even if nothing cuts it
            time.sleep(0.02)
            yield b"x"  # 50 bytes/s, far below the floor

    stream = ReadStream(drip(), start=0, close=lambda: None, clock=RequestClock("s3://b/x"))
    with pytest.raises(RetryableRemoteError, match="too slow") as info:
        list(stream)
    assert info.value.path == "s3://b/x" and "MARIN_FLOOR_BYTES_PER_SECOND" in str(info.value)
