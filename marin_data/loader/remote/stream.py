"""Remote corpora as the loader's source: ``s3://bucket/prefix``, ``hf://datasets/org/name`` or a mirror.

`make_remote_loader` (what `marin_data.loader.make_loader` calls for such a source) reads and checks the
manifest and shard index as ``download`` does (pinned ``manifest_sha256``: the root of trust), keeps them
under the cache directory, and serves batches from a `RemoteStream`: the same `TokenStream` as for a local
copy, so the same fingerprint and the same sequences, whose shards come from a bounded, verified
`marin_data.loader.remote.cache.RemoteShardCache`. The stream tells the cache which shards the next batches
read, so fetching runs ahead of use. With DataLoader workers, each worker opens its own share of the
rank's cache from a `CachePlan` (`RemoteStream.worker_init`), and the workers fetch each shard once between
them. `is_remote` tells such a source from a local path. How the prefetch, the pinning of open shards and
the workers' caches work: docs/data.md.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus
from marin_data.corpus.records import ShardRecord
from marin_data.errors import LoaderConfigError, RemoteError
from marin_data.layout import MANIFEST, SHARDS_INDEX
from marin_data.formats import ShardDecoder, decoder_for, refuse_unpinned
from marin_data.loader.cache import default_cache_dir
from marin_data.loader.dataset import TokenDataset, TokenLoader, distributed_rank
from marin_data.loader.packing import Batch
from marin_data.loader.ranks import RankRows
from marin_data.loader.remote.cache import DEFAULT_CACHE_BYTES, RemoteShardCache
from marin_data.loader.remote.files import RangedFiles, StoreFiles
from marin_data.loader.config import LoaderConfig
from marin_data.loader.stream import SERVES_CHECKED, TokenStream
from marin_data.retry import RetryPolicy
from marin_data.stores import open_store
from marin_data.stores.base import Store
from marin_data.stores.order import StoreOrder
from marin_data.transfer.apart import apart_order, data_url
from marin_data.transfer.plan import DOWNLOAD_POLICY, plan_download

__all__ = ["CachePlan", "RemoteStream", "open_remote_corpus", "make_remote_loader", "is_remote", "apart_pin",
           "remote_cache_root"]


def is_remote(source: object) -> bool:
    """Whether ``source`` names a remote corpus (``s3://``, ``hf://``) rather than a local path or `Corpus`."""
    return isinstance(source, str) and source.split("://", 1)[0] in ("s3", "hf") and "://" in source


def apart_pin(source: object) -> str | None:
    """The folder of ``source`` when it is a local pin kept apart from its data (a path or `Corpus` whose
    manifest names a ``data`` it does not hold, `data_url`), whose shards stream through the remote shard cache
    from where the data is; else None."""
    if isinstance(source, Corpus):
        root, manifest = source.root, source.manifest
    elif isinstance(source, (str, os.PathLike)) and not is_remote(source) and (Path(source) / MANIFEST).is_file():
        root = Path(source)
        try:
            manifest = Manifest.from_json((root / MANIFEST).read_bytes(), str(root / MANIFEST))
        except (ValueError, OSError):  # the loader's own reading says what is wrong with it
            return None
    else:
        return None
    return str(root) if data_url(manifest, root) else None


def remote_cache_root() -> Path:
    """``$MARIN_CACHE_DIR/remote``, else ``~/.cache/marin/remote``: beside the local decoded-shard cache."""
    return default_cache_dir().parent / "remote"


def open_remote_corpus(stores: StoreOrder | Sequence[Store], *, meta_dir: str | os.PathLike,
                       manifest_sha256: str | None = None,
                       policy: RetryPolicy = DOWNLOAD_POLICY) -> Corpus:
    """Fetch and check a remote corpus's manifest and shard index; keep them under ``meta_dir``.

    Args:
        stores: the corpus, primary first, then mirrors (tried in turn), or the run's `StoreOrder`.
        meta_dir: where ``<manifest sha256>/{manifest.json, shards.parquet}`` are kept.
        manifest_sha256: the pinned digest of ``manifest.json``.
        policy: retries per store.

    Returns:
        A `Corpus` whose ``root`` holds only the metadata (its shards are remote).

    Raises:
        ManifestHashMismatchError: no store has a manifest matching the pin.
        InvalidManifestError: a malformed manifest or index.
        RemoteError: no store could serve them.
    """
    plan, manifest_bytes, index_bytes = plan_download(stores, subsets=None, manifest_sha256=manifest_sha256,
                                                      policy=policy)
    root = Path(meta_dir) / plan.manifest_sha256
    for name, data in ((SHARDS_INDEX, index_bytes), (MANIFEST, manifest_bytes)):  # the manifest last
        path = root / name
        if not path.exists() or path.read_bytes() != data:
            atomic_write_bytes(path, data)
    return load_corpus(root, manifest_sha256=plan.manifest_sha256)


class RemoteStream(TokenStream):
    """A `TokenStream` over a remote corpus: shards through a `RemoteShardCache`, prefetched from the order.

    Args:
        corpus: the remote corpus's metadata (`open_remote_corpus`).
        config: what to serve.
        cache: the shard cache (this stream's `source`).
        lookahead: stream positions ahead whose shards are handed to the cache (it prefetches the first few
            missing ones and evicts the ones needed last); None: two mixture blocks, which covers the order in
            which a block's slots are permuted, i.e. every shard a subset reads again soon.
    """

    default_rank_rows = "shard"  # every rank fetching every shard is what costs (`marin_data.loader.ranks`)

    def __init__(self, corpus: Corpus, config: LoaderConfig, *, cache: RemoteShardCache | None,
                 lookahead: int | None = None, plan: CachePlan | None = None) -> None:
        if cache is None and plan is None:
            raise ValueError("a RemoteStream needs a cache, or the plan its DataLoader workers open theirs from")
        decoder = cache.decoder if cache is not None else plan.decoder(corpus)
        super().__init__(corpus, config, source=cache if cache is not None else _InWorkers(), decoder=decoder)
        self.plan = plan
        self._worker: tuple[int, int] | None = None  # (process id, worker id) `worker_init` opened a cache for
        self.lookahead = lookahead if lookahead is not None else 2 * max(ph.block for ph in self.mixture.phases)
        # (global batch start, this rank's rows, the shards they read): this batch's and the coming ones'
        self._horizon: deque[tuple[int, range | np.ndarray, np.ndarray]] = deque()
        self._horizon_key: tuple[str, RankRows] | None = None  # what the horizon was computed for
        self._wanted: list[ShardRecord] = []  # what the cache was last told

    def shards_at(self, positions: range | np.ndarray, split: str = "train") -> np.ndarray:
        """The shards (sorted indices into `shards`) that the sequences at ``positions`` read."""
        return self.shards_read(positions, split)

    def upcoming(self, start: int, ranks: RankRows, split: str = "train") -> list[ShardRecord]:
        """The shards that this rank's rows of the global batch at ``start`` and of the global batches in the
        next ``lookahead`` positions read, in order of first use (the batch at ``start`` is `_horizon`'s first)."""
        step = ranks.global_batch
        if self._horizon_key != (split, ranks):
            self._horizon.clear()
        self._horizon_key = (split, ranks)
        while self._horizon and self._horizon[0][0] < start:
            self._horizon.popleft()
        if self._horizon and self._horizon[0][0] != start:  # a jump (resume, new iteration)
            self._horizon.clear()
        stop = self.stop(split)
        nxt = self._horizon[-1][0] + step if self._horizon else start
        while len(self._horizon) < 1 + max(1, -(-self.lookahead // step)) and (
                nxt == start or stop is None or nxt + step <= stop):
            rows = ranks.rows(self, nxt, split)
            self._horizon.append((nxt, rows, self.shards_at(rows, split)))
            nxt += step
        ids = np.concatenate([ids for _, _, ids in self._horizon])
        _, first_use = np.unique(ids, return_index=True)
        return [self.shards[g] for g in ids[np.sort(first_use)].tolist()]

    def fill_batch(self, start: int, ranks: RankRows, out: Batch, split: str = "train") -> Batch:
        """`TokenStream.fill_batch`, with the cache told what comes next, and its open shards released when the
        cache needs the room."""
        self.prepare(start, ranks, split)
        _, rows, now = self._horizon[0]
        if self._table is not None and (self.source.starved() or not self.source.ready(self.shards[g] for g in now)):
            self._table = None  # unmap every shard the table holds, so the cache may evict them (module docstring)
        return self.fill(rows, out, split)

    def prepare(self, start: int, ranks: RankRows, split: str = "train") -> None:
        """Tell the cache which shards the batch at ``start`` and the next ones read (`upcoming`): it fetches
        the first missing ones in the background from now on."""
        coming = self.upcoming(start, ranks, split)
        if coming != self._wanted:
            self.source.want(coming)
            self._wanted = coming

    def worker_init(self, worker: int, workers: int) -> None:
        """In DataLoader worker ``worker`` of ``workers``: read through a cache of this worker's own, opened
        from `plan` (once per worker process). Its directory is the rank's with ``-workerW`` appended, its
        limit, fetch threads and shards ahead the rank's divided by ``workers`` (so the rank's workers together
        keep the rank's limit and its number of connections), and
        it shares fetches with its sibling workers' caches (and the host's other ranks' when they share),
        so a shard the rank's workers read is fetched once. A forked worker inherits the parent's cache
        object, but none of its threads: it never reads through it."""
        if self._worker == (os.getpid(), worker):
            return
        if self.plan is None:
            raise LoaderConfigError("this remote stream has no cache plan for DataLoader workers: make it with "
                                    "make_remote_loader(..., num_workers=N)")
        self.source = self.plan.open(worker, workers, corpus=self.corpus)
        self._worker = (os.getpid(), worker)
        self._table, self._wanted, self._horizon_key = None, [], None
        self._horizon.clear()

    def shard_files(self) -> RangedFiles:
        """`TokenStream.shard_files`: byte ranges of the corpus's primary store (of its data's, for a pin kept apart
        from its data)."""
        return RangedFiles(self.plan.data or self.plan.urls[0], self.plan.store_options)

    def close(self) -> None:
        """Stop the cache's prefetch threads and release its directory."""
        self.source.close()


class _InWorkers:
    """The source of a main process whose DataLoader workers read the shards (each through its own cache)."""

    def open(self, shard: ShardRecord):
        raise LoaderConfigError("this loader reads its shards in its DataLoader workers (num_workers > 0); "
                                "iterate it with TokenLoader, not in the main process")

    def want(self, shards: Sequence[ShardRecord]) -> None:
        pass  # the workers plan their own fetches

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class CachePlan:
    """How one rank's remote shard caches are opened: the rank's own, or one per DataLoader worker. Plain
    values only, so that a spawned worker gets it pickled and opens its own stores (a store's connections
    are not shared across processes, forked or not)."""

    urls: tuple[str, ...]  # the corpus, then its mirrors
    store_options: dict[str, Any]
    root: Path  # the cache root: `make_remote_loader`'s cache_dir
    name: str  # the corpus's manifest sha256, shortened
    rank: int
    max_bytes: int  # the rank's limit
    prefetch: int
    fetch_workers: int
    policy: RetryPolicy
    share: bool  # the host's ranks share fetches (the rank's own workers always do)
    data: str = ""  # where the shards are, for a pin kept apart from its data (`apart_order`)

    def open(self, worker: int | None = None, workers: int = 1, stores: StoreOrder | None = None, *,
             corpus: Corpus) -> RemoteShardCache:
        """The rank's cache (``worker`` None), or worker ``worker`` of ``workers``'s (`RemoteStream.worker_init`),
        reading what a decode needs through the same stores (`decoder`), in one `StoreOrder` (``stores``, the
        run's, or this plan's opened; either read by `_stores`)."""
        own = f"{self.name}-rank{self.rank}" + ("" if worker is None else f"-worker{worker}")
        if self.share:
            peers = self.root / f"{self.name}-peers"
        else:
            peers = None if worker is None else self.root / f"{self.name}-rank{self.rank}-peers"
        stores = self._stores(corpus, stores)
        ahead, threads = max(1, self.prefetch // workers), max(1, self.fetch_workers // workers)
        return RemoteShardCache(stores, self.root / own, max_bytes=self.max_bytes // workers, prefetch=ahead,
                                workers=threads, policy=self.policy, peers=peers, decoder=self.decoder(corpus, stores))

    def decoder(self, corpus: Corpus, stores: StoreOrder | None = None) -> ShardDecoder:
        """``corpus``'s shard decoder, reading files over ``stores`` (default: this plan's)."""
        return decoder_for(corpus, StoreFiles(stores if stores is not None else self._stores(corpus), self.policy))

    def _stores(self, corpus: Corpus, opened: StoreOrder | None = None) -> StoreOrder:
        """``opened`` (default: this plan's stores, opened), a pin kept apart from its data reading its shards
        from there (`apart_order`)."""
        opened = opened if opened is not None else StoreOrder([open_store(u, **self.store_options) for u in self.urls])
        return apart_order(opened, self.data, (s.path for s in corpus.shards), self.store_options)


def make_remote_loader(
    url: str,
    config: LoaderConfig = LoaderConfig(),
    *,
    mirrors: Sequence[str] = (),
    manifest_sha256: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    prefetch_shards: int = 8,
    fetch_workers: int = 4,
    lookahead: int | None = None,
    share: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    split: str = "train",
    prefetch: int = 2,
    num_workers: int = 0,
    pin_memory: bool = False,
    state: dict[str, Any] | None = None,
    strict: bool = True,
    policy: RetryPolicy = DOWNLOAD_POLICY,
    **store_options: Any,
) -> TokenLoader:
    """A ready loader over a remote corpus, streaming its shards through a bounded local cache.

    The stream equals that of a local copy with the same ``config`` (same fingerprint: a checkpoint taken on
    one resumes on the other).

    Args:
        url: ``s3://bucket/prefix``, ``hf://datasets/org/name[@revision]`` (``endpoint=`` for a mirror such as
            ``marin-data serve``), or a local corpus directory read like a remote one.
        config: what to serve (`LoaderConfig`).
        mirrors: fallback stores, tried in order for any file the previous ones failed.
        manifest_sha256: the pinned sha256 of ``manifest.json``.
        cache_dir: the cache root (metadata under ``meta/``, shards under ``<manifest>-rank<r>/``, the ranks'
            shared locks under ``<manifest>-peers/``); default `remote_cache_root`.
        cache_bytes: disk limit for this rank's shards.
        prefetch_shards: missing shards fetched ahead at once; fetch_workers: threads fetching them, each on
            its own connection (docs/benchmarks.md: four beat two through a link paced per connection).
        lookahead: stream positions ahead whose shards are planned (`RemoteStream`).
        share: the ranks whose caches are under the same ``cache_dir`` (those of one host, by default) fetch each
            shard once between them and hard-link it into each other's caches (`RemoteShardCache` ``peers``).
        rank, world_size: default to `torch.distributed` when initialised.
        split, prefetch, state, strict: as for `make_loader` (``prefetch``: batches built ahead by a thread,
            or by each worker).
        num_workers: DataLoader worker processes; each reads through a cache of its own, which together keep
            ``cache_bytes`` and fetch each shard once between them (`RemoteStream.worker_init`); the stream,
            and a resume at another worker count, are those of ``num_workers=0``.
        pin_memory: as for `make_loader`; policy: retries per store.
        **store_options: for `open_store`: ``endpoint_url``, ``anonymous``, ``profile`` (S3), ``endpoint``,
            ``token`` (Hugging Face).

    Call ``loader.dataset.stream.close()`` when done (the cache's threads and directory lock; they also end
    with the process). ``loader.dataset.stream.source.stats()`` reports fetches, hits and the cache's
    high-water mark (in-process; a worker's cache lives and ends with the worker).
    """
    rank, world_size = distributed_rank(rank, world_size)
    stores = StoreOrder([open_store(u, **store_options) for u in (url, *mirrors)])  # one for the run's every read
    root = Path(cache_dir) if cache_dir is not None else remote_cache_root()
    try:
        corpus = open_remote_corpus(stores, meta_dir=root / "meta", manifest_sha256=manifest_sha256, policy=policy)
    except RemoteError as e:
        if e.status == 404:
            refuse_unpinned(stores.primary, SERVES_CHECKED)
        raise
    data = data_url(corpus.manifest, None if is_remote(url) else url)  # a pin kept apart: its shards from there
    plan = CachePlan((url, *mirrors), dict(store_options), root, corpus.manifest_sha256[:16], rank, cache_bytes,
                     prefetch_shards, fetch_workers, policy, share, data)
    cache = plan.open(stores=stores, corpus=corpus) if num_workers == 0 else None  # workers open their own
    try:
        stream = RemoteStream(corpus, config, cache=cache, lookahead=lookahead, plan=plan)
        dataset = TokenDataset(stream, rank=rank, world_size=world_size, split=split,
                               prefetch=prefetch if num_workers == 0 else 0)
        if state is not None:
            dataset.load_state_dict(state, strict=strict)
    except BaseException:
        if cache is not None:
            cache.close()
        raise
    return TokenLoader(dataset, num_workers=num_workers, pin_memory=pin_memory, prefetch_factor=max(1, prefetch))
