"""A bounded on-disk cache of a remote corpus's shards: the loader's `ShardSource` for ``s3://``/``hf://``.

`RemoteShardCache` fetches a shard with the downloader's machinery (`marin_data.transfer.fetch.fetch_file`:
verified by SHA-256 before anything reads it), decodes it into memory-mappable arrays, and deletes the
Parquet bytes. Its byte limit holds at every instant (fetches reserve their peak footprint first); shards
in use (memory-mapped) are pinned; `want` takes the shards the next batches read, in order of first use, so
background threads prefetch them and eviction drops what is needed last. A new cache over the same
directory adopts the decoded shards it finds; caches on one host that share a ``peers`` directory fetch each
shard once. One process owns a cache directory. How each guarantee is kept: docs/data.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from marin_data.corpus.records import ShardRecord
from marin_data.errors import CorpusLockedError, LoaderConfigError, ShardFormatError
from marin_data.formats import ShardDecoder
from marin_data.formats.marin import ParquetDecoder
from marin_data.layout import PARTIAL_SUFFIX
from marin_data.loader.cache import SEAL, DecodedShard, DecodedShardCache, map_npy, sealed
from marin_data.retry import RetryPolicy
from marin_data.stores.base import Store
from marin_data.stores.order import StoreOrder
from marin_data.transfer.fetch import fetch_file
from marin_data.transfer.plan import DOWNLOAD_POLICY, FileTask
from marin_data.ui import human_bytes

__all__ = ["RemoteShardCache", "CacheStats", "DEFAULT_CACHE_BYTES", "decoded_bytes"]

DEFAULT_CACHE_BYTES = 64 << 30  # a training node's scratch disk holds this easily; production shards are <= 6 GiB decoded
_NPY_HEADER = 4096  # bound on one .npy header (numpy writes 128 bytes for a 1-d array): reservations are upper bounds
_LOCK = ".cache.lock"


def decoded_bytes(shard: ShardRecord) -> int:
    """Upper bound on the disk bytes of a shard's decode: ``tokens.npy`` (uint32) and ``offsets.npy`` (int64)."""
    return 4 * shard.tokens + 8 * (shard.docs + 1) + 2 * _NPY_HEADER


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
class _Entry:
    sha256: str
    shard: ShardRecord | None  # None for a decode adopted from an earlier run that this corpus does not list
    bytes: int  # on disk (ready) or reserved (fetching)
    ready: bool = False
    maps: int = 0  # live memory maps: pinned while > 0
    used: float = 0.0  # LRU clock: time of the last `open`


class RemoteShardCache:
    """Serve a remote corpus's shards as decoded memory maps through a bounded local directory.

    Args:
        stores: the primary, then mirrors, or the run's `StoreOrder` over them (shared with its metadata reads).
        cache_dir: the cache's own directory (created; locked for this process's lifetime).
        max_bytes: the disk limit for shard data (fetched Parquet, decoded arrays, partial files).
        prefetch: missing shards fetched ahead of use at once, at most (from the order given to `want`).
        workers: background fetch threads.
        policy: retries per store (`marin_data.retry`); then the next store.
        peers: a directory shared by the caches of one host (module docstring); None: share nothing.
        decoder: the corpus's shard decoder (`marin_data.formats.decoder_for`, reading what a decode needs
            besides the shard through the stores themselves); None: Parquet shards (`ParquetDecoder`).

    Raises:
        CorpusLockedError: another process (or cache object) uses ``cache_dir``.
    """

    def __init__(self, stores: StoreOrder | Sequence[Store], cache_dir: str | Path, *,
                 max_bytes: int = DEFAULT_CACHE_BYTES, prefetch: int = 4, workers: int = 2,
                 policy: RetryPolicy = DOWNLOAD_POLICY, peers: str | Path | None = None,
                 decoder: ShardDecoder | None = None) -> None:
        from filelock import FileLock, Timeout

        if max_bytes <= 0 or prefetch < 0 or workers < 1:
            raise LoaderConfigError(f"max_bytes must be > 0, prefetch >= 0 and workers >= 1, got {max_bytes}, "
                                    f"{prefetch}, {workers}")
        self.stores = StoreOrder.of(stores)
        self.root = Path(cache_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self._flock = FileLock(str(self.root / _LOCK), timeout=0)
        try:
            self._flock.acquire()
        except Timeout as e:
            raise CorpusLockedError("this shard cache directory is in use by another loader; give each process "
                                    "its own cache_dir", path=str(self.root)) from e
        self.max_bytes, self.prefetch, self.policy = int(max_bytes), prefetch, policy
        self._peers = None if peers is None else Path(peers)
        if self._peers is not None:
            (self._peers / "locks").mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # registered already; or no symlinks here: peers cannot link from us
                (self._peers / self.root.name).symlink_to(self.root.resolve(), target_is_directory=True)
        self._fetch_root = self.root / "fetch"  # verified Parquet (or chunk files), deleted once decoded
        self.decoder = decoder if decoder is not None else ParquetDecoder()
        self._decoder = DecodedShardCache(self._fetch_root, self.root / "decoded", verify=False,  # fetch verifies
                                          decoder=self.decoder)
        self._cond = threading.Condition(threading.RLock())  # re-entrant: map finalizers may run under it
        self._entries: dict[str, _Entry] = {}
        self._failed: dict[str, BaseException] = {}  # prefetches that failed; `open` tries once more
        self._wanted: list[ShardRecord] = []
        self._rank: dict[str, int] = {}  # sha256 -> position in `_wanted` (0 = needed first)
        self._stats = CacheStats(max_bytes=self.max_bytes, used_bytes=0, high_water=0)
        self._used = 0
        self._closed = False
        self._starved = False  # the last prefetch found no room (see `starved`)
        self._threads = [threading.Thread(target=self._prefetch_loop, name=f"marin-shard-fetch-{i}", daemon=True)
                         for i in range(workers if prefetch else 0)]
        self._forked = False  # set in a forked child, which inherits this object but none of its threads
        self._adopt()
        _CACHES.add(self)
        for t in self._threads:
            t.start()

    # --- public ---------------------------------------------------------------------------------------
    def open(self, shard: ShardRecord) -> DecodedShard:
        """The shard's decoded arrays as memory maps, fetching it first if it is not cached (the `ShardSource`
        method). The shard stays pinned while the returned arrays are alive.

        Raises:
            TransferFailedError: no store served a verified copy.
            LoaderConfigError: ``max_bytes`` cannot hold this shard next to the shards in use.
        """
        t0, hit = time.perf_counter(), True
        while True:
            with self._cond:
                self._check_open()
                entry, fetch = self._claim(shard)
                if not fetch:
                    hit = hit and entry.ready
                    while not entry.ready and self._entries.get(shard.sha256) is entry:  # a prefetch is on it
                        self._cond.wait(timeout=1.0)
                        self._check_open()
                    if entry.ready:
                        waited = 0.0 if hit else time.perf_counter() - t0
                        self._stats = replace(self._stats, hits=self._stats.hits + hit,
                                              misses=self._stats.misses + (not hit),
                                              wait_seconds=self._stats.wait_seconds + waited)
                        return self._map(entry)
                    continue  # the prefetch failed: claim it again and fetch it here, once more
            hit = False
            self._fetch(entry)

    def want(self, shards: Sequence[ShardRecord]) -> None:
        """The shards the next batches read, in order of first use (duplicates ignored): prefetch the first
        ``prefetch`` missing ones in the background, and keep the soonest-needed from eviction."""
        order = list({s.sha256: s for s in reversed(shards)}.values())[::-1]  # first occurrence of each
        with self._cond:
            self._wanted = order
            self._rank = {s.sha256: i for i, s in enumerate(order)}
            self._cond.notify_all()

    def starved(self) -> bool:
        """Whether a prefetch is waiting for room that only unmapping shards in use can make."""
        with self._cond:
            return self._starved

    def ready(self, shards) -> bool:
        """Whether every one of ``shards`` is cached, decoded, ready to map."""
        with self._cond:
            return all((e := self._entries.get(s.sha256)) is not None and e.ready for s in shards)

    def stats(self) -> CacheStats:
        with self._cond:
            ready = sum(e.ready for e in self._entries.values())
            return replace(self._stats, used_bytes=self._used, fetches=Counter(self._stats.fetches), resident=ready)

    def close(self) -> None:
        """Stop the prefetch threads (waiting for fetches in flight, bounded) and release the directory."""
        if self._forked:  # the parent's lock on the directory is the parent's: releasing it here would free it
            return
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=30)
        self._flock.release()

    def __enter__(self) -> RemoteShardCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        raise TypeError("a remote shard cache cannot be sent to another process: a loader with DataLoader "
                        "workers opens one in each worker (make_remote_loader(num_workers=...))")

    def _after_fork_in_child(self) -> None:
        """In a forked child: the fetch threads do not exist there and the lock may have been held by one of
        them at the fork, so the copy gets a fresh lock, no threads, and refuses to serve (`_check_open`);
        maps inherited from the parent still unpin under the fresh lock when they are dropped."""
        self._cond = threading.Condition(threading.RLock())
        self._threads, self._closed, self._forked = [], True, True

    # --- claiming space -------------------------------------------------------------------------------
    def _claim(self, shard: ShardRecord) -> tuple[_Entry, bool]:
        """Under the lock: the shard's entry, and whether the caller must fetch it (space reserved)."""
        while True:
            entry = self._entries.get(shard.sha256)
            if entry is not None:
                if entry.shard is None:  # adopted from an earlier run: now we know what it is
                    entry.shard = shard
                return entry, False
            self._failed.pop(shard.sha256, None)
            if self._reserve(shard, -1):
                return self._add(shard), True

    def _add(self, shard: ShardRecord) -> _Entry:
        entry = self._entries[shard.sha256] = _Entry(shard.sha256, shard, _footprint(shard))
        return entry

    def _reserve(self, shard: ShardRecord, rank: int) -> bool:
        """Make room for ``shard``'s fetch and reserve it. ``rank`` -1 is a demand (may wait, evicts any
        unpinned shard, raises when nothing can ever make room); a prefetch's rank is its place in `_wanted`
        (evicts only shards needed later, returns False when there is no room now)."""
        need = _footprint(shard)
        if need > self.max_bytes:
            raise LoaderConfigError(f"shard {shard.path} needs {human_bytes(need)} to fetch and decode, more than "
                                    f"the cache's whole limit of {human_bytes(self.max_bytes)}: raise it",
                                    path=str(self.root), expected=need, actual=self.max_bytes)
        while self._used + need > self.max_bytes:
            victim = self._victim(rank)
            if victim is not None:
                self._evict(victim)
                continue
            if rank >= 0:
                return False
            if any(not e.ready for e in self._entries.values()):  # fetches in flight will become evictable
                self._cond.wait(timeout=1.0)
                self._check_open()
                if shard.sha256 in self._entries:  # a prefetch took it meanwhile
                    return False
                continue
            pinned = sum(e.bytes for e in self._entries.values() if e.maps)
            raise LoaderConfigError(
                f"the shard cache limit ({human_bytes(self.max_bytes)}) cannot hold {shard.path} "
                f"({human_bytes(need)}) next to the {human_bytes(pinned)} of shards in use: raise the limit to at "
                "least a few batches' worth of shards", path=str(self.root), expected=need, actual=self.max_bytes)
        self._used += need
        self._stats = replace(self._stats, high_water=max(self._stats.high_water, self._used))
        return True

    def _victim(self, rank: int) -> _Entry | None:
        """The entry to evict for a fetch of priority ``rank`` (see `_reserve`), or None."""
        free = [e for e in self._entries.values() if e.ready and not e.maps]
        unwanted = [e for e in free if e.sha256 not in self._rank]
        if unwanted:
            return min(unwanted, key=lambda e: e.used)
        later = [e for e in free if self._rank[e.sha256] > rank]
        return max(later, key=lambda e: self._rank[e.sha256]) if later else None

    def _evict(self, entry: _Entry) -> None:
        shutil.rmtree(self._decoded_dir(entry.sha256), ignore_errors=True)
        del self._entries[entry.sha256]
        self._used -= entry.bytes
        self._stats = replace(self._stats, evictions=self._stats.evictions + 1)

    # --- fetching -------------------------------------------------------------------------------------
    def _fetch(self, entry: _Entry) -> None:
        """Fetch (or link from a peer), verify and decode ``entry``'s shard (space is reserved); on failure
        forget it and re-raise."""
        shard = entry.shard
        received = None  # stays None for a shard linked from a peer
        try:
            with self._peer_lock(shard.sha256):
                if not self._link_from_peer(shard.sha256):
                    received = self._fetch_and_decode(shard)
        except BaseException:
            shutil.rmtree(self._decoded_dir(shard.sha256), ignore_errors=True)  # files first, then the account
            with self._cond:
                del self._entries[shard.sha256]
                self._used -= entry.bytes
                self._cond.notify_all()
            raise
        size = _dir_bytes(self._decoded_dir(shard.sha256))
        with self._cond:
            self._used += size - entry.bytes
            entry.bytes, entry.ready, entry.used = size, True, time.monotonic()
            if received is None:
                self._stats = replace(self._stats, shared=self._stats.shared + 1)
            else:
                fetches = Counter(self._stats.fetches)
                fetches[shard.path] += 1
                self._stats = replace(self._stats, fetches=fetches,
                                      bytes_fetched=self._stats.bytes_fetched + received)
            self._cond.notify_all()

    def _fetch_and_decode(self, shard: ShardRecord) -> int:
        """Fetch the shard's verified Parquet, decode it, delete the Parquet; returns the bytes received."""
        parquet = self._fetch_root / shard.path
        try:
            received = fetch_file(self._fetch_root, FileTask(shard.path, shard.bytes, shard.sha256, shard.subset),
                                  self.stores, policy=self.policy)
            self._decoder.ensure(shard)
        finally:
            parquet.unlink(missing_ok=True)
            parquet.with_name(parquet.name + PARTIAL_SUFFIX).unlink(missing_ok=True)
        return received

    def _peer_lock(self, sha256: str):
        """Held while a shard is fetched or linked, so the caches of one host fetch it once."""
        if self._peers is None:
            return contextlib.nullcontext()
        from filelock import FileLock

        return FileLock(str(self._peers / "locks" / f"{sha256}.lock"))

    def _link_from_peer(self, sha256: str) -> bool:
        """Hard-link a peer's complete decode of the shard into this cache; False when no peer has one."""
        if self._peers is None:
            return False
        own = self._decoded_dir(sha256)
        for peer in sorted(p for p in self._peers.iterdir() if p.is_symlink() and p.name != self.root.name):
            src = peer / "decoded" / sha256[:2] / sha256
            if not sealed(src):
                continue
            own.mkdir(parents=True, exist_ok=True)
            try:
                for name in ("offsets.npy", "tokens.npy", SEAL):  # the seal last: it means a complete decode
                    os.link(src / name, own / name)
                return True
            except OSError:  # the peer evicted it meanwhile, or another file system: try the next, then fetch
                shutil.rmtree(own, ignore_errors=True)
        return False

    def _prefetch_loop(self) -> None:
        while True:
            with self._cond:
                entry = None
                while not self._closed and (entry := self._next_prefetch()) is None:
                    self._cond.wait(timeout=1.0)
                if self._closed:
                    return
            try:
                self._fetch(entry)
            except Exception as e:  # noqa: BLE001 - kept for `open`, which tries again and raises
                with self._cond:
                    self._failed[entry.shard.sha256] = e

    def _next_prefetch(self) -> _Entry | None:
        """Under the lock: claim the first wanted shard that is missing, if there is room for it."""
        missing = 0
        for rank, shard in enumerate(self._wanted):
            if shard.sha256 in self._entries and self._entries[shard.sha256].ready:
                continue
            missing += 1
            if missing > self.prefetch:
                return None
            if shard.sha256 in self._entries or shard.sha256 in self._failed or _footprint(shard) > self.max_bytes:
                continue  # in flight, or failed / too large: `open` retries it and raises
            self._starved = not self._reserve(shard, rank)
            return None if self._starved else self._add(shard)
        self._starved = False
        return None

    # --- maps and disk --------------------------------------------------------------------------------
    def _map(self, entry: _Entry) -> DecodedShard:
        """Under the lock: memory maps of a ready entry, each pinning it until it is garbage."""
        shard = entry.shard
        tokens_path, offsets_path = self._decoder.paths(shard)
        tokens, offsets = map_npy(tokens_path), map_npy(offsets_path)
        # a cache's chunk file decodes to its pieces of documents, not to the documents that start in it
        pieces = len(offsets) == shard.docs + 1 or (self.decoder.pieces and 2 <= len(offsets) <= shard.docs + 2)
        if tokens.shape != (shard.tokens,) or not pieces or offsets[-1] != shard.tokens:
            del tokens, offsets
            self._evict(entry)
            raise ShardFormatError(f"cached decode holds {tokens_path.stat().st_size} bytes, not the "
                                   f"{shard.tokens} tokens the index lists; it was deleted, run again",
                                   path=str(tokens_path))
        for m in (tokens, offsets):
            entry.maps += 1
            weakref.finalize(m, self._unmapped, entry).atexit = False
        entry.used = time.monotonic()
        return DecodedShard(np.asarray(tokens), np.asarray(offsets))

    def _unmapped(self, entry: _Entry) -> None:
        with self._cond:
            entry.maps -= 1
            if not entry.maps:
                self._cond.notify_all()

    def _decoded_dir(self, sha256: str) -> Path:
        return self.root / "decoded" / sha256[:2] / sha256

    def _adopt(self) -> None:
        """Take over the complete decodes an earlier run left (oldest first out); delete partial files."""
        shutil.rmtree(self._fetch_root, ignore_errors=True)
        found = []
        for d in sorted((self.root / "decoded").glob("??/*")):
            if not sealed(d) or any(p.name.endswith(".part") for p in d.iterdir()):
                shutil.rmtree(d, ignore_errors=True)
                continue
            found.append((d.stat().st_mtime, d.name, _dir_bytes(d)))
        for mtime, sha, size in sorted(found):
            self._entries[sha] = _Entry(sha, None, size, ready=True, used=mtime - time.time() + time.monotonic())
            self._used += size
        while self._used > self.max_bytes:
            self._evict(min(self._entries.values(), key=lambda e: e.used))
        self._stats = replace(self._stats, high_water=self._used)

    def _check_open(self) -> None:
        if self._forked:
            raise RuntimeError("this remote shard cache belongs to the process this one was forked from; a "
                               "DataLoader worker reads through its own (RemoteStream.worker_init)")
        if self._closed:
            raise RuntimeError("the remote shard cache is closed")


_CACHES: weakref.WeakSet[RemoteShardCache] = weakref.WeakSet()  # this process's caches, for `_forget_at_fork`


def _forget_at_fork() -> None:
    for cache in list(_CACHES):
        cache._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_at_fork)


def _footprint(shard: ShardRecord) -> int:
    """Peak disk bytes while a shard is fetched and decoded: its Parquet file beside its decode."""
    return shard.bytes + decoded_bytes(shard)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
