"""A bounded on-disk cache of a remote corpus's shards: the loader's `ShardSource` for ``s3://``/``hf://``.

`RemoteShardCache` fetches a shard with the downloader's machinery, verified by SHA-256 before anything
decodes it, and decodes it into memory-mappable arrays: a shard of up to ``memory_bytes`` straight from the
bytes received (`marin_data.transfer.body.fetch_body`: hashed as they arrive, never written to disk), a larger
one from a file it deletes once decoded (`marin_data.transfer.fetch.fetch_file`). Its byte limit holds at
every instant (fetches reserve their peak footprint first); shards in use (memory-mapped) are pinned; `want`
takes the shards the next batches read, in order of first use, so background threads prefetch them and
eviction drops what is needed last. A new cache over the same directory adopts the decoded shards it finds;
caches on one host that share a ``peers`` directory fetch each shard once. One process owns a cache directory.
How each guarantee is kept: docs/data.md.


The cache composes one module per concept: the byte budget and eviction (`budget`), the prefetch threads
(`prefetch`), sharing a host's fetches (`peers`), what a forked child does with it (`forks`), and taking over
the decodes an earlier run left (`adopt`); it serves and fetches.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from marin_data.corpus.records import ShardRecord
from marin_data.errors import CorpusLockedError, LoaderConfigError, ShardFormatError
from marin_data.formats import ShardDecoder
from marin_data.formats.marin import ParquetDecoder
from marin_data.layout import PARTIAL_SUFFIX
from marin_data.loader.cache import DecodedShard, DecodedShardCache, map_npy
from marin_data.loader.remote import forks
from marin_data.loader.remote.adopt import found_decodes
from marin_data.loader.remote.budget import Budget, CacheStats, Entry, decoded_dir, dir_bytes
from marin_data.loader.remote.peers import Peers
from marin_data.loader.remote.prefetch import Prefetcher
from marin_data.retry import RetryPolicy
from marin_data.stores.base import Store
from marin_data.stores.order import StoreOrder
from marin_data.transfer.body import fetch_body
from marin_data.transfer.fetch import fetch_file
from marin_data.transfer.plan import DOWNLOAD_POLICY, FileTask

__all__ = ["RemoteShardCache", "CacheStats", "DEFAULT_CACHE_BYTES", "MEMORY_BYTES"]

DEFAULT_CACHE_BYTES = 64 << 30  # a training node's scratch disk holds this easily; production shards are <= 6 GiB decoded
MEMORY_BYTES = 256 << 20  # a fetch thread holds at most this much of a shard in memory (`RemoteShardCache`)
_LOCK = ".cache.lock"


class RemoteShardCache:
    """Serve a remote corpus's shards as decoded memory maps through a bounded local directory.

    Args:
        stores: the primary, then mirrors, or the run's `StoreOrder` over them (shared with its metadata reads).
        cache_dir: the cache's own directory (created; locked for this process's lifetime).
        max_bytes: the limit for shard data: decoded arrays on disk, and fetched shards (in memory or files).
        prefetch: missing shards fetched ahead of use at once, at most (from the order given to `want`).
        workers: background fetch threads.
        policy: retries per store (`marin_data.retry`); then the next store.
        peers: a directory shared by the caches of one host (module docstring); None: share nothing.
        decoder: the corpus's shard decoder (`marin_data.formats.decoder_for`, reading what a decode needs
            besides the shard through the stores themselves); None: Parquet shards (`ParquetDecoder`).
        memory_bytes: shards up to this size are fetched into memory and decoded from there; larger ones
            through a file. Either way a fetch reserves the shard's bytes beside its decode in ``max_bytes``.

    Raises:
        CorpusLockedError: another process (or cache object) uses ``cache_dir``.
    """

    def __init__(self, stores: StoreOrder | Sequence[Store], cache_dir: str | Path, *,
                 max_bytes: int = DEFAULT_CACHE_BYTES, prefetch: int = 8, workers: int = 4,
                 policy: RetryPolicy = DOWNLOAD_POLICY, peers: str | Path | None = None,
                 decoder: ShardDecoder | None = None, memory_bytes: int = MEMORY_BYTES) -> None:
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
        self.max_bytes, self.prefetch, self.policy, self.memory_bytes = int(max_bytes), prefetch, policy, memory_bytes
        self._peers = None if peers is None else Peers(Path(peers), self.root)
        self._fetch_root = self.root / "fetch"  # verified shards over memory_bytes, deleted once decoded
        self.decoder = decoder if decoder is not None else ParquetDecoder()
        self._decoder = DecodedShardCache(self._fetch_root, self.root / "decoded", verify=False,  # fetch verifies
                                          decoder=self.decoder)
        self._cond = threading.Condition(threading.RLock())  # re-entrant: map finalizers may run under it
        self._budget = Budget(self.root, self.max_bytes)
        self._closed = False
        self._prefetcher = Prefetcher(self, prefetch, workers)
        self._forked = False  # set in a forked child, which inherits this object but none of its threads
        self._budget.adopt(found_decodes(self.root, self._fetch_root))
        forks.track(self)
        self._prefetcher.start()

    @property
    def _entries(self) -> dict[str, Entry]:
        return self._budget.entries

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
                        b = self._budget
                        b.stats = replace(b.stats, hits=b.stats.hits + hit, misses=b.stats.misses + (not hit),
                                          wait_seconds=b.stats.wait_seconds + waited)
                        return self._map(entry)
                    continue  # the prefetch failed: claim it again and fetch it here, once more
            hit = False
            self._fetch(entry)

    def want(self, shards: Sequence[ShardRecord]) -> None:
        """The shards the next batches read, in order of first use (duplicates ignored): prefetch the first
        ``prefetch`` missing ones in the background, and keep the soonest-needed from eviction."""
        with self._cond:
            self._budget.want(shards)
            self._cond.notify_all()

    def starved(self) -> bool:
        """Whether a prefetch is waiting for room that only unmapping shards in use can make."""
        with self._cond:
            return self._prefetcher.starved

    def ready(self, shards) -> bool:
        """Whether every one of ``shards`` is cached, decoded, ready to map."""
        with self._cond:
            return all((e := self._entries.get(s.sha256)) is not None and e.ready for s in shards)

    def stats(self) -> CacheStats:
        with self._cond:
            b = self._budget
            ready = sum(e.ready for e in b.entries.values())
            return replace(b.stats, used_bytes=b.used, fetches=Counter(b.stats.fetches), resident=ready)

    def close(self) -> None:
        """Stop the prefetch threads (waiting for fetches in flight, bounded) and release the directory."""
        if self._forked:  # the parent's lock on the directory is the parent's: releasing it here would free it
            return
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._prefetcher.join(timeout=30)
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
        self._prefetcher.threads, self._closed, self._forked = [], True, True

    # --- claiming space -------------------------------------------------------------------------------
    def _claim(self, shard: ShardRecord) -> tuple[Entry, bool]:
        """Under the lock: the shard's entry, and whether the caller must fetch it (space reserved)."""
        while True:
            entry = self._budget.entries.get(shard.sha256)
            if entry is not None:
                if entry.shard is None:  # adopted from an earlier run: now we know what it is
                    entry.shard = shard
                return entry, False
            self._prefetcher.failed.pop(shard.sha256, None)
            if self._budget.reserve(shard, -1, self._wait_for_room):
                return self._budget.add(shard), True

    def _wait_for_room(self) -> None:
        """Under the lock: wait a while for fetches in flight to end (`Budget.reserve`)."""
        self._cond.wait(timeout=1.0)
        self._check_open()

    def _evict(self, entry: Entry) -> None:
        self._budget.evict(entry)

    # --- fetching -------------------------------------------------------------------------------------
    def _fetch(self, entry: Entry) -> None:
        """Fetch (or link from a peer), verify and decode ``entry``'s shard (space is reserved); on failure
        forget it and re-raise."""
        shard = entry.shard
        received = None  # stays None for a shard linked from a peer
        try:
            with contextlib.nullcontext() if self._peers is None else self._peers.lock(shard.sha256):
                if self._peers is None or not self._peers.link(shard.sha256):
                    received = self._fetch_and_decode(shard)
        except BaseException:
            shutil.rmtree(decoded_dir(self.root, shard.sha256), ignore_errors=True)  # files first, then the account
            with self._cond:
                self._budget.drop(entry)
                self._cond.notify_all()
            raise
        size = dir_bytes(decoded_dir(self.root, shard.sha256))
        with self._cond:
            b = self._budget
            b.settle(entry, size)
            if received is None:
                b.stats = replace(b.stats, shared=b.stats.shared + 1)
            else:
                fetches = Counter(b.stats.fetches)
                fetches[shard.path] += 1
                b.stats = replace(b.stats, fetches=fetches, bytes_fetched=b.stats.bytes_fetched + received)
            self._cond.notify_all()

    def _fetch_and_decode(self, shard: ShardRecord) -> int:
        """Fetch the shard's verified bytes and decode them (module docstring); returns the bytes received."""
        task = FileTask(shard.path, shard.bytes, shard.sha256, shard.subset)
        if shard.bytes <= self.memory_bytes:
            body, received = fetch_body(task, self.stores, policy=self.policy)
            self._decoder.ensure(shard, body)
            return received
        parquet = self._fetch_root / shard.path
        try:
            received = fetch_file(self._fetch_root, task, self.stores, policy=self.policy)
            self._decoder.ensure(shard)
        finally:
            parquet.unlink(missing_ok=True)
            parquet.with_name(parquet.name + PARTIAL_SUFFIX).unlink(missing_ok=True)
        return received

    # --- maps and disk --------------------------------------------------------------------------------
    def _map(self, entry: Entry) -> DecodedShard:
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

    def _unmapped(self, entry: Entry) -> None:
        with self._cond:
            entry.maps -= 1
            if not entry.maps:
                self._cond.notify_all()

    def _check_open(self) -> None:
        if self._forked:
            raise RuntimeError("this remote shard cache belongs to the process this one was forked from; a "
                               "DataLoader worker reads through its own (RemoteStream.worker_init)")
        if self._closed:
            raise RuntimeError("the remote shard cache is closed")
