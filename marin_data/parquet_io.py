"""Opening Parquet files for reading: every Parquet read of the library goes through `open_parquet`.

pyarrow decodes on its CPU thread pool by default. When the bytes live in memory Python owns (``bytes``, a
Python file object such as a store's ranged reader), a decode task can drop the last reference to that
memory after the read has returned; releasing it takes the GIL, and if the interpreter is finalizing by
then, Python ends the pool thread inside a C++ destructor and the process aborts with "terminate called
without an active exception" (the backtrace runs ``PyGILState_Ensure <- arrow::py::PyBuffer::~PyBuffer <-
FileReaderImpl::DecodeRowGroups <- ThreadPool``). So a Python-owned source is decoded on the calling thread;
a path is opened by Arrow's own file system, owns its memory, and keeps the thread pool.
``tests/test_architecture.py`` fails on a Parquet read anywhere else, so the rule cannot be bypassed.
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["open_parquet"]


def open_parquet(source: str | os.PathLike | bytes | Any, **kwargs: Any):
    """A ``pyarrow.parquet.ParquetFile`` over ``source``: a path, the file's bytes, or a binary file object.

    ``kwargs`` go to ``ParquetFile`` (``pre_buffer=False``, say). For bytes and file objects every read
    (``read``, ``read_row_group(s)``, ``iter_batches``) runs on the calling thread, whatever it is asked.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(source, (str, os.PathLike)):
        return pq.ParquetFile(source, **kwargs)
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = pa.BufferReader(source)
    return _on_calling_thread()(source, **kwargs)


@functools.cache
def _on_calling_thread() -> type:
    import pyarrow.parquet as pq

    class OnCallingThread(pq.ParquetFile):
        def read(self, *args, **kw):
            return super().read(*args, **{**kw, "use_threads": False})

        def read_row_group(self, *args, **kw):
            return super().read_row_group(*args, **{**kw, "use_threads": False})

        def read_row_groups(self, *args, **kw):
            return super().read_row_groups(*args, **{**kw, "use_threads": False})

        def iter_batches(self, *args, **kw):
            return super().iter_batches(*args, **{**kw, "use_threads": False})

    return OnCallingThread
