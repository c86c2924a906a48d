"""The train cache of each component of a run, opened from its ledgers (no data), and what a window of its
flat tokens touches: documents (from the offsets, `marin_data.levanter.order.offsets`) and, where the store
is pinned in place (``manifest.json`` + ``shards.parquet`` at its root), the cell, the data chunk files with
their SHA-256 and the cell's license.

A component's ``cache_dir`` is opened as it is (a local path, ``s3://``, ``hf://``) unless ``--store ROOT``
is given: then the cache is the folder of ROOT named by the longest tail of ``cache_dir`` that holds a
``shard_ledger.json`` (``gs://bucket/store/cluster=3/quality=4`` is ``ROOT/cluster=3/quality=4``), found by
a few ``head`` requests and never by listing the store.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

import numpy as np

from marin_data.corpus.index import read_shard_index
from marin_data.corpus.manifest import Manifest
from marin_data.errors import MarinDataError, TrainConfigError
from marin_data.layout import MANIFEST
from marin_data.levanter.cache import LevanterCache, open_cache
from marin_data.levanter.ledger import LEDGER
from marin_data.levanter.order.offsets import Document, InnerChunks, Offsets, Ranged, documents_in
from marin_data.transfer.read import join
from marin_data.stores import open_store
from marin_data.stores.base import Store
from marin_data.stores.local import LocalStore
from marin_data.transfer.apart import data_url, kept_apart
from marin_data.transfer.plan import plan_download

__all__ = ["ComponentCache", "Pin", "open_components"]


@dataclass(frozen=True)
class Pin:
    """A pinned cell: its license and its data chunk files' SHA-256 by path."""

    cell: str
    license: str
    sha256: dict[str, str]


@dataclass
class ComponentCache:
    """One component's train cache, its parts laid end to end as Levanter reads them."""

    name: str
    cache: LevanterCache
    cell: str | None = None
    pin: Pin | None = None
    kept: InnerChunks = field(default_factory=InnerChunks)  # shared by the components of a trace
    _arrays: dict = field(default_factory=dict)  # part -> Offsets, ("data", part) -> its tokens

    def __post_init__(self) -> None:
        # plain ints: a step looks a window up in them 11,264 times, where bisect beats numpy's per-call cost
        self.token_starts = list(itertools.accumulate([p.tokens for p in self.cache.parts], initial=0))
        self.row_starts = list(itertools.accumulate([p.rows for p in self.cache.parts], initial=0))

    @property
    def inner_reads(self) -> int:
        """Inner chunks read from the store so far (offsets and tokens)."""
        return sum(a.inner_reads for a in self._arrays.values())

    @property
    def block_reads(self) -> int:
        """Blocks of them decoded so far."""
        return sum(a.block_reads for a in self._arrays.values())

    @property
    def tokens(self) -> int:
        return self.token_starts[-1]

    def offsets(self, k: int) -> Offsets:
        if k not in self._arrays:
            self._arrays[k] = Offsets(self.cache, self.cache.parts[k], self.kept)
        return self._arrays[k]

    def _parts(self, start: int, stop: int):
        """(part number, part-local start, stop) of the parts that flat tokens ``[start, stop)`` touch."""
        k = bisect.bisect_right(self.token_starts, start) - 1
        while k < len(self.cache.parts) and self.token_starts[k] < stop:
            base = self.token_starts[k]
            yield k, max(start, base) - base, min(stop, self.token_starts[k + 1]) - base
            k += 1

    def tokens_in(self, start: int, stop: int) -> np.ndarray:
        """Flat tokens ``[start, stop)`` (uint32), read by inner chunk from the data chunk files."""
        out = [np.zeros(0, np.uint32)]
        for k, a, b in self._parts(start, stop):
            key = ("data", k)
            if key not in self._arrays:
                self._arrays[key] = Ranged(self.cache, self.cache.parts[k], self.kept, tokens=True)
            out.append(self._arrays[key].values(a, b).astype(np.uint32))
        return np.concatenate(out)

    def documents(self, start: int, stop: int) -> list[Document]:
        out: list[Document] = []
        for k, a, b in self._parts(start, stop):
            out += documents_in(self.offsets(k), a, b, self.row_starts[k])
        return out

    def row_tokens(self, row: int) -> tuple[int, int]:
        """Where row ``row`` lies in the flat tokens: ``[start, stop)``."""
        if not 0 <= row < self.row_starts[-1]:
            raise TrainConfigError(f"component {self.name!r} has rows 0 to {self.row_starts[-1] - 1:,}, "
                                   f"not {row:,}")
        k = bisect.bisect_right(self.row_starts, row) - 1
        local = row - self.row_starts[k]
        a, b = self.offsets(k).values(local, local + 2)
        return self.token_starts[k] + int(a), self.token_starts[k] + int(b)

    def shards(self, start: int, stop: int) -> list[dict]:
        """The data chunk files holding tokens ``[start, stop)``, with their SHA-256 (pinned caches only)."""
        out = []
        for k, a, b in self._parts(start, stop):
            part = self.cache.parts[k]
            for chunk in part.data_chunks()[a // part.data.chunk:(b - 1) // part.data.chunk + 1]:
                out.append({"path": chunk.path, "sha256": self.pin.sha256.get(chunk.path) if self.pin else None})
        return out


def _find_cell(store: Store, cache_dir: str) -> str:
    """The longest tail of ``cache_dir`` that is a cache root on ``store``."""
    parts = [p for p in cache_dir.split("://", 1)[-1].split("/") if p]
    for n in range(len(parts) - 1, -1, -1):
        prefix = "/".join(parts[n:])
        if store.head(join(prefix, LEDGER)) is not None:
            return prefix
    raise TrainConfigError(f"no cache under the store for {cache_dir!r}: none of its trailing folders holds a "
                           f"{LEDGER}", path=store.url)


def _pins(store: Store, options: dict) -> tuple[dict[str, Pin] | None, Store]:
    """The pinned cells of a store root (local, ``s3://``, ``hf://``): its manifest and shard index, checked as
    a download checks them; None when it has no manifest. Then the store its cells are read from: ``store``,
    or for a pin kept apart from its data one reading them where the data is (`kept_apart`, with ``options``)."""
    if store.head(MANIFEST) is None:
        return None, store
    _, manifest_bytes, index_bytes = plan_download([store], subsets=None)
    manifest = Manifest.from_json(manifest_bytes, store.describe(MANIFEST))
    digests: dict[str, dict[str, str]] = {}
    for row in read_shard_index(index_bytes, metadata=manifest.files):
        digests.setdefault(row.subset, {})[row.path] = row.sha256
    data = data_url(manifest, store.root if isinstance(store, LocalStore) else None)
    cells = kept_apart(store, data, (p for cell, rows in digests.items() if cell is not None for p in rows), options)
    return {name: Pin(name, info.license, digests.get(name, {})) for name, info in manifest.subsets.items()}, cells


def open_components(cache_dirs: dict[str, str], *, store: str | Store | None = None,
                    **options) -> dict[str, ComponentCache]:
    """Open each component's train cache (name -> cache root as the YAML names it); ``store`` is a URL or an
    opened `Store` (a pinned store's manifest names each cell's license and each chunk file's SHA-256).

    Raises:
        TrainConfigError: a cache that is not where the YAML (or ``--store``) says.
        CacheFormatError, CacheUnfinishedError: a ledger or ``zarr.json`` that cannot be read.
    """
    out, kept = {}, InnerChunks()
    root = store if isinstance(store, Store) else open_store(store, **options) if store else None
    pins, root = _pins(root, options) if root is not None else (None, None)
    for name, cache_dir in cache_dirs.items():
        if root is not None:
            cell = _find_cell(root, cache_dir)
            cache = open_cache(root, cell, listed=False)  # reads chunk files by position: no listing
            out[name] = ComponentCache(name, cache, cell, (pins or {}).get(cell), kept)
            continue
        if "://" in cache_dir and not cache_dir.startswith(("s3://", "hf://")):
            raise TrainConfigError(f"component {name!r}: its cache {cache_dir!r} is on a store marin does not "
                                   "read; copy it and pass --store ROOT (the folder holding its cells)")
        try:
            cache = open_cache(open_store(cache_dir, **options), listed=False)
            out[name] = ComponentCache(name, cache, kept=kept)
        except MarinDataError as e:
            if store is None and not e.path:
                e.path = cache_dir
            raise
    return out
