"""`open_parquet` decodes a Python-owned source on the calling thread and a path on Arrow's thread pool.

A decode task on the pool that holds Python-owned memory can outlive the read and abort the process at
interpreter exit (`marin_data.fileio.parquet_io`); these tests see which threads touch such a source.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_data.fileio.parquet_io import open_parquet


class ThreadRecordingFile(io.BytesIO):
    """A Python file object that notes the thread of every read."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.threads: set[int] = set()

    def read(self, *args):
        self.threads.add(threading.get_ident())
        return super().read(*args)

    def readinto(self, b):
        self.threads.add(threading.get_ident())
        return super().readinto(b)


@pytest.fixture(scope="module")
def parquet_bytes() -> bytes:
    columns = {f"c{i}": np.arange(i, i + 200_000, dtype=np.int64) for i in range(8)}
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink, row_group_size=20_000)
    return sink.getvalue()


@pytest.mark.parametrize("how", ["read", "read_row_groups", "iter_batches"])
def test_a_python_file_object_is_only_read_on_the_calling_thread(parquet_bytes, how):
    source = ThreadRecordingFile(parquet_bytes)
    with open_parquet(source, pre_buffer=False) as pf:
        if how == "read":
            table = pf.read(use_threads=True)  # asked for the pool: still decoded here
        elif how == "read_row_groups":
            table = pf.read_row_groups(list(range(pf.num_row_groups)), use_threads=True)
        else:
            table = pa.Table.from_batches(list(pf.iter_batches(use_threads=True)))
    assert table.num_rows == 200_000 and table.column("c7").to_pylist()[-1] == 7 + 199_999
    assert source.threads == {threading.get_ident()}


def test_bytes_and_paths_read_the_same_table(parquet_bytes, tmp_path):
    path = tmp_path / "t.parquet"
    path.write_bytes(parquet_bytes)
    with open_parquet(parquet_bytes) as from_bytes, open_parquet(path) as from_path:
        assert from_bytes.read().equals(from_path.read())


@pytest.mark.parametrize("kind", ["path", "bytes", "file"])
def test_a_footer_over_the_limit_is_refused_before_pyarrow_parses_it(tmp_path, kind):
    table = pa.table({"a": [1]}).replace_schema_metadata({"x": "y" * (64 << 10)})  # a 64 KiB footer
    pq.write_table(table, tmp_path / "big-footer.parquet")
    data = (tmp_path / "big-footer.parquet").read_bytes()
    source = {"path": tmp_path / "big-footer.parquet", "bytes": data, "file": io.BytesIO(data)}[kind]
    with pytest.raises(ValueError, match="footer of"):
        open_parquet(source, max_footer=32 << 10)
    assert open_parquet(source, max_footer=1 << 20).metadata.num_rows == 1
