"""A remote corpus's files read through its stores: small ones whole into memory (`StoreFiles`), a shard in
byte ranges (`RangedFiles`).

`StoreFiles`: a remote corpus's small files read whole into memory, each checked against its row of the index: what a
pinned Levanter cache's cells (`marin_data.levanter.PinnedCells`) read over the network (ledgers,
``zarr.json`` files, offsets chunk files) besides the data chunk files the shard cache fetches.

Nothing is written to disk: an offsets chunk file is decoded once per process and its bytes dropped, so
these files never count against the shard cache's byte limit. As a download does, a copy whose size or
SHA-256 differs from the index is read again (a body damaged on the way), network errors are retried, and
then the next store is tried (the primary, then the mirrors, in the run's `marin_data.stores.order.StoreOrder`,
which the shard cache shares).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from marin_data.corpus.records import ShardRecord
from marin_data.errors import CacheFormatError, RemoteError, ShardChecksumError, TransferFailedError
from marin_data.transfer.read import read_file
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores import open_store
from marin_data.stores.base import Store
from marin_data.stores.order import StoreOrder
from marin_data.transfer.plan import DOWNLOAD_POLICY
from marin_data.transfer.remote_corpus import StoreFile

__all__ = ["StoreFiles", "RangedFiles"]


@dataclass(frozen=True)
class StoreFiles:
    """``read(row) -> bytes`` over ``stores`` (a `marin_data.formats.Reader`)."""

    stores: StoreOrder
    policy: RetryPolicy = DOWNLOAD_POLICY

    def __call__(self, row: ShardRecord) -> bytes:
        """The checked bytes of ``row``'s file.

        Raises:
            TransferFailedError: no store served a copy matching the index; ``failures`` names each one's error.
        """
        failures = []
        for store, tried in self.stores.tries(self.policy):
            again = replace(tried, retry_on=(ShardChecksumError,))  # `read_file` retries the network itself
            try:
                return retry_call(lambda: _checked(store, row, tried), policy=again, what=store.describe(row.path))
            except (RemoteError, CacheFormatError, ShardChecksumError) as e:
                failures.append((store.describe(row.path), str(e)))
        raise TransferFailedError(f"could not read a verified copy: {'; '.join(w for _, w in failures)}",
                                  path=row.path, failures=failures)


def _checked(store: Store, row: ShardRecord, policy: RetryPolicy) -> bytes:
    data = read_file(store, row.path, limit=row.bytes, policy=policy)  # one byte more is enough to refuse it
    if data is None:
        raise RemoteError("not found", path=store.describe(row.path), status=404)
    digest = hashlib.sha256(data).hexdigest()
    if (digest, len(data)) != (row.sha256, row.bytes):
        raise ShardChecksumError(f"sha256/size {digest[:12]}…/{len(data)} != {row.sha256[:12]}…/{row.bytes} listed "
                                 "in the shard index", path=store.describe(row.path), expected=row.sha256,
                                 actual=digest)
    return data


class RangedFiles:
    """``files(row)``: a seekable file over ``row``'s object in the store at ``url``, each read one ranged request
    (`StoreFile`, unverified: what ``show`` reads), the store opened on first use."""

    def __init__(self, url: str, store_options: dict[str, Any]) -> None:
        self.url, self.store_options = url, store_options
        self._store: Store | None = None

    def __call__(self, row: ShardRecord) -> StoreFile:
        if self._store is None:
            self._store = open_store(self.url, **self.store_options)
        return StoreFile(self._store, row.path, row.bytes)
