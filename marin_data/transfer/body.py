"""Fetching one file into memory instead of onto disk: the loader's remote shard cache decodes a shard from
the bytes it received, so they never take the trip to disk, fsync, back and away.

`fetch_body` fills a `MemoryPartial` (memory Arrow owns, `marin_data.fileio.parquet_io.ArrowBytes`, which
Parquet decodes on Arrow's thread pool) on the machinery of `fetch_file`: the bytes are hashed as they
arrive, a dropped connection resumes with a ranged request from where it stopped, a copy whose size or
SHA-256 differs from the index is discarded and fetched again, and then the next store is tried. Nothing
is returned that has not matched the index whole, so no unchecked byte is ever decoded into the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

from marin_data.errors import TransferFailedError
from marin_data.fileio.parquet_io import ArrowBytes
from marin_data.retry import RetryPolicy
from marin_data.stores.base import Store
from marin_data.stores.order import StoreOrder
from marin_data.transfer.fetch import ByteMeter, from_stores
from marin_data.transfer.partial import Prefix, hasher
from marin_data.transfer.plan import DOWNLOAD_POLICY, FileTask
from marin_data.ui import progress as progress_bar

__all__ = ["MemoryPartial", "fetch_body"]


class MemoryPartial(Prefix):
    """``task``'s file received into ``body`` (its listed size, allocated up front), hashed in step."""

    def __init__(self, task: FileTask) -> None:
        self.task, self.body = task, ArrowBytes(task.bytes)
        self.reset()

    def reset(self) -> None:
        self.hash, self.offset = hasher(self.task), 0

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``, cut at the listed size: the bytes past it are not the file's."""
        chunk = chunk[:self.task.bytes - self.offset]
        self.body.view[self.offset:self.offset + len(chunk)] = chunk
        self.hash.update(chunk)
        self.offset += len(chunk)


def fetch_body(task: FileTask, stores: StoreOrder | Sequence[Store], *,
               policy: RetryPolicy = DOWNLOAD_POLICY) -> tuple[ArrowBytes, int]:
    """``task``'s file whole in memory, checked against its size and SHA-256, and the bytes received for it
    (counting any discarded and fetched again).

    Raises:
        TransferFailedError: every store failed; ``failures`` holds one ``(path, why)`` naming each store's error.
    """
    meter = ByteMeter(progress_bar(None, "fetch", disable=True))
    partial = MemoryPartial(task)
    why = from_stores(partial, StoreOrder.of(stores), policy, meter)
    if why is not None:
        raise TransferFailedError(f"could not fetch a verified copy: {why}", path=task.path,
                                  failures=[(task.path, why)])
    return partial.body, meter.received
