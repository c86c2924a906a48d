"""The remote shard cache's byte budget: what it holds on disk or has reserved, against its limit, and what it
evicts to make room (`marin_data.loader.remote.cache.RemoteShardCache`; docs/data.md).

A fetch reserves its peak footprint first (the shard's fetched bytes, in memory or a file, beside its decode),
so the limit holds at every instant; once decoded, the reservation becomes the decode's size on disk. Room is
made by evicting ready shards that no memory map pins: first those no coming batch wants (least recently used
first), then those wanted latest. A demand (``rank`` -1) may evict any of them and waits for fetches in
flight; a prefetch (its rank in the wanted order) evicts only shards needed after it and gives up when there
is no room now. Nothing here locks: the cache calls every method under its own lock.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from marin_data.corpus.records import ShardRecord
from marin_data.errors import LoaderConfigError
from marin_data.ui import human_bytes

__all__ = ["Budget", "CacheStats", "Entry", "decoded_bytes", "decoded_dir", "dir_bytes"]

_NPY_HEADER = 4096  # bound on one .npy header (numpy writes 128 bytes for a 1-d array): reservations are upper bounds


def decoded_bytes(shard: ShardRecord) -> int:
    """Upper bound on the disk bytes of a shard's decode: ``tokens.npy`` (uint32) and ``offsets.npy`` (int64)."""
    return 4 * shard.tokens + 8 * (shard.docs + 1) + 2 * _NPY_HEADER


def _footprint(shard: ShardRecord) -> int:
    """Peak disk bytes while a shard is fetched and decoded: its Parquet file beside its decode."""
    return shard.bytes + decoded_bytes(shard)


def decoded_dir(root: Path, sha256: str) -> Path:
    """Where the cache at ``root`` keeps the decode of the shard with ``sha256``."""
    return root / "decoded" / sha256[:2] / sha256


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


@dataclass(frozen=True)
class CacheStats:
    """What the cache did so far (a snapshot; `RemoteShardCache.stats`)."""

    max_bytes: int
    used_bytes: int  # on disk or reserved now
    high_water: int  # the most ever on disk or reserved: never above max_bytes
    fetches: Counter = field(default_factory=Counter)  # shard path -> times fetched and decoded
    bytes_fetched: int = 0  # received over the network, including bodies discarded and fetched again
    hits: int = 0  # `open` found the shard ready
    misses: int = 0  # `open` had to wait for a fetch (its own or a prefetch in flight)
    evictions: int = 0
    shared: int = 0  # shards hard-linked from a peer cache (the same host) instead of fetched
    wait_seconds: float = 0.0  # time `open` spent waiting for shards: the loader's share of data wait
    resident: int = 0  # shards ready on disk now


@dataclass
class Entry:
    sha256: str
    shard: ShardRecord | None  # None for a decode adopted from an earlier run that this corpus does not list
    bytes: int  # on disk (ready) or reserved (fetching)
    ready: bool = False
    maps: int = 0  # live memory maps: pinned while > 0
    used: float = 0.0  # LRU clock: time of the last `open`


class Budget:
    """The entries of the cache at ``root`` and the bytes they take against ``max_bytes`` (module docstring);
    ``stats``: the cache's counts, kept here since most of them are the budget's."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root, self.max_bytes = root, max_bytes
        self.entries: dict[str, Entry] = {}
        self.used = 0
        self.wanted: list[ShardRecord] = []  # the shards the next batches read, in order of first use
        self.rank: dict[str, int] = {}  # sha256 -> position in `wanted` (0 = needed first)
        self.stats = CacheStats(max_bytes=max_bytes, used_bytes=0, high_water=0)

    def want(self, shards: Sequence[ShardRecord]) -> None:
        """Set `wanted` (duplicates ignored: the first occurrence of each counts)."""
        self.wanted = list({s.sha256: s for s in reversed(shards)}.values())[::-1]
        self.rank = {s.sha256: i for i, s in enumerate(self.wanted)}

    def fits(self, shard: ShardRecord) -> bool:
        """Whether ``shard``'s fetch fits the whole limit at all."""
        return _footprint(shard) <= self.max_bytes

    def add(self, shard: ShardRecord) -> Entry:
        """The entry of a shard whose room `reserve` just reserved."""
        entry = self.entries[shard.sha256] = Entry(shard.sha256, shard, _footprint(shard))
        return entry

    def reserve(self, shard: ShardRecord, rank: int, wait: Callable[[], None]) -> bool:
        """Make room for ``shard``'s fetch and reserve it. ``rank`` -1 is a demand (calls ``wait`` while fetches
        in flight may yet free room, raises when nothing can ever make room); a prefetch's rank is its place in
        `wanted` (returns False when there is no room now). False too when the shard got an entry meanwhile.

        Raises:
            LoaderConfigError: the limit cannot hold the shard, or not next to the shards in use.
        """
        need = _footprint(shard)
        if need > self.max_bytes:
            raise LoaderConfigError(f"shard {shard.path} needs {human_bytes(need)} to fetch and decode, more than "
                                    f"the cache's whole limit of {human_bytes(self.max_bytes)}: raise it",
                                    path=str(self.root), expected=need, actual=self.max_bytes)
        while self.used + need > self.max_bytes:
            victim = self._victim(rank)
            if victim is not None:
                self.evict(victim)
                continue
            if rank >= 0:
                return False
            if any(not e.ready for e in self.entries.values()):  # fetches in flight will become evictable
                wait()
                if shard.sha256 in self.entries:  # a prefetch took it meanwhile
                    return False
                continue
            pinned = sum(e.bytes for e in self.entries.values() if e.maps)
            raise LoaderConfigError(
                f"the shard cache limit ({human_bytes(self.max_bytes)}) cannot hold {shard.path} "
                f"({human_bytes(need)}) next to the {human_bytes(pinned)} of shards in use: raise the limit to at "
                "least a few batches' worth of shards", path=str(self.root), expected=need, actual=self.max_bytes)
        self.used += need
        self.stats = replace(self.stats, high_water=max(self.stats.high_water, self.used))
        return True

    def _victim(self, rank: int) -> Entry | None:
        """The entry to evict for a fetch of priority ``rank`` (see `reserve`), or None."""
        free = [e for e in self.entries.values() if e.ready and not e.maps]
        unwanted = [e for e in free if e.sha256 not in self.rank]
        if unwanted:
            return min(unwanted, key=lambda e: e.used)
        later = [e for e in free if self.rank[e.sha256] > rank]
        return max(later, key=lambda e: self.rank[e.sha256]) if later else None

    def evict(self, entry: Entry) -> None:
        """Delete a ready entry's decode and its account."""
        shutil.rmtree(decoded_dir(self.root, entry.sha256), ignore_errors=True)
        del self.entries[entry.sha256]
        self.used -= entry.bytes
        self.stats = replace(self.stats, evictions=self.stats.evictions + 1)

    def drop(self, entry: Entry) -> None:
        """Forget an entry whose fetch failed (its files already deleted), releasing its reservation."""
        del self.entries[entry.sha256]
        self.used -= entry.bytes

    def settle(self, entry: Entry, size: int) -> None:
        """A fetched entry is ready and takes ``size`` bytes on disk instead of its reservation."""
        self.used += size - entry.bytes
        entry.bytes, entry.ready, entry.used = size, True, time.monotonic()

    def adopt(self, found: Sequence[tuple[float, str, int]]) -> None:
        """Take ``(mtime, sha256, bytes)`` decodes left on disk as ready entries (oldest first out), evicting the
        oldest while over the limit."""
        for mtime, sha, size in sorted(found):
            self.entries[sha] = Entry(sha, None, size, ready=True, used=mtime - time.time() + time.monotonic())
            self.used += size
        while self.used > self.max_bytes:
            self.evict(min(self.entries.values(), key=lambda e: e.used))
        self.stats = replace(self.stats, high_water=self.used)
