"""Fetching one file into place: hashed while it streams, renamed only once its size and SHA-256 match.

`fetch_file` fetches one `FileTask` on the machinery of ``download`` (which runs `fetch_one` for many files
on a thread pool): the bytes go into a partial file (`marin_data.transfer.partial`), each store is tried in
turn (in the run's `marin_data.stores.order.StoreOrder`: a store that keeps failing comes last) under a
retry policy, and a file already there and matching is kept (`already_there`). The loader's remote shard
cache (`marin_data.loader.remote.cache`) fetches shards through `fetch_file`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from marin_data.fileio.atomic import SafeDir
from marin_data.errors import RemoteError, ShardChecksumError, TransferFailedError
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores.base import Store
from marin_data.stores.checksums import file_digests
from marin_data.stores.order import StoreOrder
from marin_data.transfer.partial import Prefix, RangedPartial, StreamPartial, open_partial, partial_path
from marin_data.transfer.plan import DOWNLOAD_POLICY, FileTask
from marin_data.ui import progress as progress_bar

__all__ = ["PART_BYTES", "ByteMeter", "already_there", "fetch_one", "fetch_file", "from_stores"]

PART_BYTES = 64 << 20  # smallest byte range of a file fetched in parallel ranges


@dataclass
class ByteMeter:
    """Bytes received, counted from several threads, behind the progress bar."""

    bar: object
    received: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)  # set on Ctrl-C: workers quit mid-file

    def got(self, n: int) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt  # what is written so far stays in the partial file, for the next run
        with self.lock:
            self.received += n
            self.bar.update(n)


def fetch_file(root: str | os.PathLike, task: FileTask, stores: StoreOrder | Sequence[Store], *,
               policy: RetryPolicy = DOWNLOAD_POLICY) -> int:
    """Fetch one file to ``root/task.path`` on the machinery of `download`: hashed while it streams, renamed
    into place only once its size and SHA-256 match ``task``, retried, then tried on the next store.

    The loader's remote shard cache (`marin_data.loader.remote.cache`) fetches shards through it, with one
    `StoreOrder` for all of them.

    Returns:
        Bytes received (counting any that were discarded and fetched again).

    Raises:
        TransferFailedError: every store failed; ``failures`` holds one ``(path, why)`` naming each store's error.
    """
    meter = ByteMeter(progress_bar(None, "fetch", disable=True))
    why = fetch_one(Path(root), task, StoreOrder.of(stores), policy, meter)
    if why is not None:
        raise TransferFailedError(f"could not fetch a verified copy: {why}", path=task.path,
                                  failures=[(task.path, why)])
    return meter.received


def already_there(root: Path, task: FileTask, seen: dict[str, str] | None = None) -> bool:
    """True when the final file holds exactly the listed bytes (of the listed size, for a task without a
    digest: a file gets its final name only once fetched whole); its SHA-256 goes into ``seen`` (path ->
    hex) when it was hashed. A wrong one never stays under its final
    name: a shorter one becomes the partial file (its prefix may be good), anything else is removed. A link
    or a folder in its place (or in the folders above it, below ``root``) is refused: `UnsafeDestinationError`."""
    final = root / task.path
    with SafeDir.of(final, root) as folder:
        st = folder.regular(final.name)
        if st is None:
            return False
        if st.st_size == task.bytes:
            if not task.checksums and task.sha256 is None:
                return True
            digests, _ = file_digests(folder.open(final.name, os.O_RDONLY), (a for a, _ in task.checksums))
            if task.mismatch(digests) is None:
                if seen is not None:
                    seen[task.path] = digests["sha256"]
                return True
        partial = partial_path(final).name
        if st.st_size < task.bytes and folder.lstat(partial) is None:
            os.replace(final.name, partial, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
        else:
            folder.unlink(final.name)
    return False


def fetch_one(root: Path, task: FileTask, order: StoreOrder, policy: RetryPolicy,
              meter: ByteMeter, ranges: int = 1, part_bytes: int = PART_BYTES,
              seen: dict[str, str] | None = None) -> str | None:
    """Fetch one file into place (in up to ``ranges`` parallel ranges of at least ``part_bytes`` when it has two
    or more, or a partial in ranges is there) from the stores of ``order``; return None on success, else why
    it failed on every store. The SHA-256 of the bytes put in place goes into ``seen`` (path -> hex)."""
    final = root / task.path
    with SafeDir.of(final, root) as folder:
        partial = open_partial(folder, final.name, task, ranges=ranges, part_bytes=part_bytes)
        try:
            why = from_stores(partial, order, policy, meter)
            if why is None:
                partial.commit(final.name)
                if seen is not None:
                    seen[task.path] = partial.digests["sha256"]
        finally:
            partial.close()
    return why


def from_stores(partial: StreamPartial | RangedPartial | Prefix, order: StoreOrder, policy: RetryPolicy,
                meter: ByteMeter) -> str | None:
    """Fill and check ``partial`` from the stores of ``order`` in turn, each retried under ``policy``; None once
    one served the listed bytes, else why each failed."""
    errors = []
    for store, tried in order.tries(policy):
        try:
            retry_call(lambda: partial.fetch(store, meter), policy=tried, what=store.describe(partial.task.path))
        except (RemoteError, ShardChecksumError) as e:
            errors.append(f"{store.url}: {e.message}")
            continue
        return None
    return "; ".join(errors)
