"""Where a streamed GET's body starts and stops: the check every remote store makes before a reader writes
at an offset, and the cut at the end of the range asked for, whatever the server goes on sending."""

from __future__ import annotations

import itertools

import pytest

from marin_data.errors import RetryableRemoteError
from marin_data.stores.base import READ_CHUNK, ReadStream, body_span


def test_a_200_is_the_whole_object_whatever_range_was_asked():
    assert body_span(200, None, 0, None, "s3://b/x", lambda: None) == (0, None)
    assert body_span(200, "bytes 100-199/200", 100, 200, "s3://b/x", lambda: None) == (0, 200)


def test_a_206_starts_where_its_content_range_says_and_stops_at_the_first_end():
    assert body_span(206, "bytes 1048576-2097151/2097152", 1048576, None, "hf://d/x", lambda: None) == \
        (1048576, 2097152)
    assert body_span(206, "bytes 100-999/1000", 100, 200, "hf://d/x", lambda: None) == (100, 200)  # more than asked
    assert body_span(206, "bytes 100-149/*", 100, 200, "hf://d/x", lambda: None) == (100, 150)


@pytest.mark.parametrize("header", [None, "", "items 0-1/2", "bytes */200", "bytes 0-99/200", "bytes 100-50/200",
                                    "bytes 101-199/200"])
def test_a_206_without_a_content_range_matching_the_request_is_closed_and_retried(header):
    closed = []
    with pytest.raises(RetryableRemoteError, match="Content-Range") as info:
        body_span(206, header, 100, 200, "s3://b/data/x.parquet", lambda: closed.append(True))
    assert closed == [True] and info.value.path == "s3://b/data/x.parquet"


def test_a_stream_stops_at_its_end_however_much_the_server_sends():
    endless = (b"x" * 1000 for _ in itertools.count())
    stream = ReadStream(endless, start=0, stop=READ_CHUNK + 2500, close=lambda: None)
    sizes = [len(c) for c in stream]  # the pieces as they arrive, joined into chunks of about READ_CHUNK
    assert sum(sizes) == READ_CHUNK + 2500 and len(sizes) == 2 and sizes[0] >= READ_CHUNK
