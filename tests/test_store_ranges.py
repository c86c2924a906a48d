"""Where a streamed GET's body starts: the check both remote stores use before writing at an offset."""

from __future__ import annotations

import pytest

from marin_data.errors import RetryableRemoteError
from marin_data.stores.base import body_start


def test_a_200_is_the_whole_object_whatever_range_was_asked():
    assert body_start(200, None, "s3://b/x", lambda: None) == 0
    assert body_start(200, "bytes 100-199/200", "s3://b/x", lambda: None) == 0


def test_a_206_starts_where_its_content_range_says():
    assert body_start(206, "bytes 1048576-2097151/2097152", "hf://d/x", lambda: None) == 1048576


@pytest.mark.parametrize("header", [None, "", "items 0-1/2", "bytes */200"])
def test_a_206_without_a_usable_content_range_is_closed_and_retried(header):
    closed = []
    with pytest.raises(RetryableRemoteError, match="Content-Range") as info:
        body_start(206, header, "s3://b/data/x.parquet", lambda: closed.append(True))
    assert closed == [True] and info.value.path == "s3://b/data/x.parquet"
