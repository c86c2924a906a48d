"""The remote shard cache's prefetch: background threads that fetch the shards the next batches read before
the loader asks for them (`RemoteShardCache.want` gives their order of first use; docs/data.md).

Each thread claims the first wanted shard that is neither ready nor in flight, among the first ``prefetch``
missing ones, when the budget has room for it without evicting anything needed sooner
(`marin_data.loader.remote.budget`); otherwise it waits for the order or the room to change. A prefetch that
fails is remembered, not raised: the loader's own ``open`` of that shard tries once more and raises. When a
prefetch finds no room that only unmapping shards in use can make, the cache is `starved` and the stream
releases its maps.
"""

from __future__ import annotations

import threading
from typing import Any

from marin_data.loader.remote.budget import Entry

__all__ = ["Prefetcher"]


class Prefetcher:
    """``workers`` threads prefetching for ``cache`` (a `RemoteShardCache`: its lock, budget and fetch), at most
    ``prefetch`` missing shards ahead; none when ``prefetch`` is 0."""

    def __init__(self, cache: Any, prefetch: int, workers: int) -> None:
        self.cache, self.prefetch = cache, prefetch
        self.failed: dict[str, BaseException] = {}  # sha256 -> why its prefetch failed; `open` tries once more
        self.starved = False  # the last prefetch found no room (`RemoteShardCache.starved`)
        self.threads = [threading.Thread(target=self._loop, name=f"marin-shard-fetch-{i}", daemon=True)
                        for i in range(workers if prefetch else 0)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        """Wait for each thread to end (the cache is closed first), ``timeout`` seconds each at most."""
        for t in self.threads:
            t.join(timeout=timeout)

    def _loop(self) -> None:
        cache = self.cache
        while True:
            with cache._cond:
                entry = None
                while not cache._closed and (entry := self.next()) is None:
                    cache._cond.wait(timeout=1.0)
                if cache._closed:
                    return
            try:
                cache._fetch(entry)
            except Exception as e:  # noqa: BLE001 - kept for `open`, which tries again and raises
                with cache._cond:
                    self.failed[entry.shard.sha256] = e

    def next(self) -> Entry | None:
        """Under the cache's lock: claim the first wanted shard that is missing, if there is room for it."""
        budget, missing = self.cache._budget, 0
        for rank, shard in enumerate(budget.wanted):
            entry = budget.entries.get(shard.sha256)
            if entry is not None and entry.ready:
                continue
            missing += 1
            if missing > self.prefetch:
                return None
            if entry is not None or shard.sha256 in self.failed or not budget.fits(shard):
                continue  # in flight, or failed / too large: `open` retries it and raises
            self.starved = not budget.reserve(shard, rank, self.cache._wait_for_room)
            return None if self.starved else budget.add(shard)
        self.starved = False
        return None
