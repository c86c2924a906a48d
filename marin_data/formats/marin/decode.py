"""The loader's decoder of Parquet shards: a shard's ``tokens`` column straight into the loader's local form
(``tokens`` uint32 ``[N]``, ``offsets`` int64 ``[docs + 1]``), one copy and no document ids.

A shard's row groups are decoded on up to ``threads`` threads at once (pyarrow decodes one column of one
row group on one core, releasing the GIL) and written out in order as each is ready, so at most
``threads + 1`` decoded row groups are in memory. Each thread reads through its own ``ParquetFile``, opened
by path or over the shard's bytes in memory Arrow owns (`ArrowBytes`: a fetched shard, never written to
disk): Arrow owns that memory either way, which is what makes decoding off the calling thread safe
(`marin_data.fileio.parquet_io`). The bytes written do not depend on the number of threads.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from marin_data.corpus.manifest import Corpus
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.shard import check_schema, check_shard_counts, check_shard_file
from marin_data.errors import ShardFormatError, ShardMissingError
from marin_data.fileio.arrays import view, write_npy
from marin_data.fileio.parquet_io import ArrowBytes, open_parquet
from marin_data.formats.marin.documents import ParquetDocuments

__all__ = ["ParquetDecoder", "decode_threads"]


def decode_threads() -> int:
    """The default number of decode threads: the cores this process may run on, at most 4."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


class ParquetDecoder:
    """A Parquet corpus's shards for the loader: each subset's shards by path, decoded whole (``corpus``:
    whose shards `order` orders; a decoder without one only decodes). ``threads``: row groups decoded at
    once (default `decode_threads`)."""

    pieces = False

    def __init__(self, corpus: Corpus | None = None, *, threads: int | None = None) -> None:
        self.corpus = corpus
        self.threads = threads if threads is not None else decode_threads()

    def order(self, subsets: Sequence[str]) -> list[tuple[ShardRecord, ...]]:
        if self.corpus is None:
            raise ValueError("this ParquetDecoder was made without its corpus: it decodes, but orders nothing")
        files: dict[str, list[ShardRecord]] = {n: [] for n in subsets}
        for shard in self.corpus.shards:
            if shard.subset in files:
                files[shard.subset].append(shard)
        return [tuple(sorted(files[n], key=lambda s: s.path)) for n in subsets]

    def documents(self, stream: Any) -> ParquetDocuments:
        """Where ``stream``'s documents lie: its shards' row groups, read from its ``shard_files()``."""
        return ParquetDocuments(stream, stream.shard_files())

    def context(self, shard: ShardRecord) -> None:
        return None  # a Parquet shard's decode depends on its bytes alone

    def decode_into(self, source: Path | ArrowBytes, shard: ShardRecord, tokens_path: Path, offsets_path: Path, *,
                    verify: bool) -> None:
        """Decode a shard's ``tokens`` column straight into ``.npy`` files (the tokens file is written with the
        index's count, and discarded by the caller when the shard holds another). ``source``: the shard file's
        path, or its bytes, which were checked as they arrived (`marin_data.transfer.body`): ``verify``
        hashes a path only.

        Raises:
            ShardMissingError: the shard file is not there (a partial download).
            ShardChecksumError: ``verify`` and its SHA-256 or size differ from the index's (checked before
                anything is decoded).
            ShardFormatError: unreadable, or its document/token counts differ from the index's.
        """
        on_disk = not isinstance(source, ArrowBytes)
        path = source if on_disk else Path(shard.path)  # what errors name
        if on_disk and verify:
            check_shard_file(path, shard)
        elif on_disk and not path.exists():
            raise ShardMissingError(f"shard of subset {shard.subset!r} is not on local disk", path=str(path))
        ends: list[np.ndarray] = []
        count = [0, 0]  # documents, tokens

        def values() -> Iterator[np.ndarray]:
            try:
                for column in _row_groups(source, path, self.threads):
                    for chunk in column.chunks:
                        offsets = view(chunk.offsets, np.int64)
                        ends.append(offsets[1:] - offsets[0] + count[1])
                        count[0] += len(chunk)
                        count[1] += int(offsets[-1] - offsets[0])
                        yield view(chunk.values, np.uint32)[offsets[0]:offsets[-1]]
            except ShardFormatError:
                raise
            except (OSError, ValueError, KeyError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
                raise ShardFormatError(f"not a readable shard: {e}", path=str(path)) from e

        write_npy(tokens_path, np.uint32, shard.tokens, values())  # its own errors (a full disk) as they are
        check_shard_counts(path, shard, *count)
        write_npy(offsets_path, np.int64, count[0] + 1, [np.zeros(1, np.int64), *ends])


def _row_groups(source: Path | ArrowBytes, path: Path, threads: int) -> Iterator[Any]:
    """The ``tokens`` column of each row group of the shard in ``source`` (named ``path``), in order, decoded
    ``threads`` at a time (each thread through its own file), at most ``threads + 1`` decoded or being decoded.

    Raises ShardFormatError when the schema is not the shard format's; pyarrow's errors as they come."""
    with open_parquet(source) as pf:
        check_schema(pf.schema_arrow, path)  # the values are written out as uint32 unconverted
        groups = pf.metadata.num_row_groups
        if threads <= 1 or groups <= 1:
            for g in range(groups):
                yield pf.read_row_group(g, columns=["tokens"]).column("tokens")
            return
    local, opened = threading.local(), []

    def read(g: int) -> Any:
        if not hasattr(local, "file"):
            local.file = open_parquet(source)
            opened.append(local.file)
        return local.file.read_row_group(g, columns=["tokens"]).column("tokens")

    pending: deque = deque()
    pool = ThreadPoolExecutor(max_workers=min(threads, groups), thread_name_prefix="marin-decode")
    try:
        pending.extend(pool.submit(read, g) for g in range(min(groups, threads + 1)))
        following = len(pending)
        while pending:
            column = pending.popleft().result()
            if following < groups:
                pending.append(pool.submit(read, following))
                following += 1
            yield column
    finally:  # the consumer may have stopped early: what was not started is dropped, what runs is awaited
        pool.shutdown(wait=True, cancel_futures=True)
        for f in opened:
            f.close()
