"""Opening Parquet files for reading: every Parquet read of the library goes through `open_parquet`.

pyarrow decodes on its CPU thread pool by default. When the bytes live in memory Python owns (``bytes``, a
Python file object such as a store's ranged reader), a decode task can drop the last reference to that memory
after the read has returned; releasing it takes the GIL, and if the interpreter is finalizing by then, Python
ends the pool thread inside a C++ destructor and the process aborts with "terminate called without an active
exception" (the backtrace runs ``PyGILState_Ensure <- arrow::py::PyBuffer::~PyBuffer <-
FileReaderImpl::DecodeRowGroups <- ThreadPool``). So a Python-owned source is decoded on the calling thread; a
path is opened by Arrow's own file system, owns its memory, and keeps the thread pool, and so does an
`ArrowBytes`: a file's bytes copied into memory Arrow allocated (a fetched shard,
`marin_data.transfer.fetch`), which no Python object backs. ``tests/test_architecture.py`` fails on a Parquet
read anywhere else, so the rule cannot be bypassed.


What a Parquet file decodes to is not bounded by its size: a zstd page of one repeated byte, or a dictionary
value that a million rows repeat, expands 10,000-fold. So `open_parquet` refuses a footer over
`MAX_FOOTER_BYTES` before pyarrow parses it, and `decoded_bound` gives, from the footer alone, the most
bytes that reading some columns of some row groups can take, for the caller to check against its own
limit before it decodes anything.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Collection, Iterable
from typing import Any

__all__ = ["MAX_FOOTER_BYTES", "ArrowBytes", "open_parquet", "decoded_bound"]

MAX_FOOTER_BYTES = 16 << 20  # a 5 GiB shard of 1M-token row groups has a footer of ~2 MiB
_FIXED_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
_DICTIONARY = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}


class ArrowBytes:
    """``size`` bytes of memory that Arrow allocates and owns, filled through ``view`` (a writable memoryview):
    `open_parquet` reads them on Arrow's thread pool, as it does a path, since dropping the last reference to
    them never needs the GIL. ``buffer`` is the ``pyarrow.Buffer``; ``len`` its size."""

    def __init__(self, size: int) -> None:
        import pyarrow as pa

        self.buffer = pa.allocate_buffer(size)
        self.view = memoryview(self.buffer).cast("B")

    def __len__(self) -> int:
        return self.buffer.size


def open_parquet(source: str | os.PathLike | bytes | ArrowBytes | Any, *, max_footer: int = MAX_FOOTER_BYTES,
                 **kwargs: Any):
    """A ``pyarrow.parquet.ParquetFile`` over ``source``: a path, the file's bytes, an `ArrowBytes`, or a binary
    file object.

    ``kwargs`` go to ``ParquetFile`` (``pre_buffer=False``, ``read_dictionary=[...]``, say). For bytes and file
    objects every read (``read``, ``read_row_group(s)``, ``iter_batches``) runs on the calling thread,
    whatever it is asked; paths and `ArrowBytes` keep Arrow's thread pool.

    Raises:
        ValueError: the footer is over ``max_footer`` bytes (checked from the file's last 8 bytes, before
            pyarrow parses it); pyarrow's own errors on a file that is no Parquet (``ArrowInvalid``, also a
            ValueError) and OSError.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    footer = _footer_length(source)
    if footer > max_footer:
        raise ValueError(f"Parquet footer of {footer:,} bytes, over the {max_footer:,} bytes a footer may take")
    if isinstance(source, (str, os.PathLike)):
        return pq.ParquetFile(source, **kwargs)
    if isinstance(source, ArrowBytes):
        return pq.ParquetFile(pa.BufferReader(source.buffer), **kwargs)
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = pa.BufferReader(source)
    return _on_calling_thread()(source, **kwargs)


def _footer_length(source: str | os.PathLike | bytes | Any) -> int:
    """The footer length the file's last 8 bytes state (0 when they are no Parquet tail: pyarrow says why)."""
    if isinstance(source, ArrowBytes):
        source = source.view
    if isinstance(source, (bytes, bytearray, memoryview)):
        tail = bytes(source[-8:])
    elif isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            tail = f.read(8) if f.seek(0, io.SEEK_END) < 8 else (f.seek(-8, io.SEEK_END), f.read(8))[1]
    else:
        end = source.seek(0, io.SEEK_END)
        source.seek(max(0, end - 8))
        tail = source.read(8)
        source.seek(0)
    return int.from_bytes(tail[:4], "little") if len(tail) == 8 and tail[4:] == b"PAR1" else 0


def decoded_bound(metadata, columns: Collection[str], *, row_groups: Iterable[int] | None = None,
                  dictionary: Collection[str] = ()) -> int:
    """The most bytes reading ``columns`` (top-level names) of ``row_groups`` (all by default) can decode to,
    from the footer's column chunk metadata alone.

    Fixed-width values take their width per value. A string (BYTE_ARRAY) chunk takes its uncompressed size
    when no value can repeat (no dictionary, no front coding: every value is stored whole) or when its column
    is in ``dictionary`` (read with ``read_dictionary``: each distinct value once, twice over while the
    dictionary is built); otherwise a value may repeat, and the bound is the rows times the longest value
    the chunk may hold (its uncompressed size). Every value also gets 8 bytes of offsets and validity. The
    sizes are the footer's own; a crafted file can state smaller ones than its page headers (docs/security.md).
    """
    bound = 0
    for rg in range(metadata.num_row_groups) if row_groups is None else row_groups:
        group = metadata.row_group(rg)
        for i in range(group.num_columns):
            chunk = group.column(i)
            if chunk.path_in_schema.split(".")[0] not in columns:
                continue
            n, kind = chunk.num_values, chunk.physical_type
            if kind == "FIXED_LEN_BYTE_ARRAY":
                bound += n * (metadata.schema.column(i).length + 8)
            elif kind != "BYTE_ARRAY":
                bound += n * (_FIXED_WIDTH[kind] + 8)
            else:
                bound += n * 8 + _strings_bound(chunk, dictionary=chunk.path_in_schema.split(".")[0] in dictionary)
    return bound


def _strings_bound(chunk, *, dictionary: bool) -> int:
    size, encodings = chunk.total_uncompressed_size, set(chunk.encodings)
    if "DELTA_BYTE_ARRAY" not in encodings:  # front coding rebuilds values longer than what is stored
        if dictionary:
            return 2 * size
        if not encodings & _DICTIONARY:
            return size
    return chunk.num_values * size


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
