"""What a download will fetch: the manifest and shard index read and checked, the subsets resolved.

`plan_download` reads the manifest from the first store that serves one matching the pinned digest, then
``shards.parquet`` (checked against the manifest's digest), and lists every file to fetch as a `FileTask`
(metadata files first, then the chosen subsets' shards). No bucket listing: it is slow and may be forbidden.
Both come by content where the store keeps them so (`marin_data.transfer.versions`): an older version
stays readable by its pin, and a publish under way is never seen half done.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from marin_data.corpus.index import read_shard_index
from marin_data.corpus.manifest import Manifest
from marin_data.corpus.names import select_subsets
from marin_data.errors import (
    InvalidManifestError,
    ManifestHashMismatchError,
    RemoteError,
    RetryableRemoteError,
    ShardChecksumError,
)
from marin_data.layout import MANIFEST, SHARDS_INDEX
from marin_data.retry import DEFAULT_POLICY, RetryPolicy, retry_call
from marin_data.stores.base import METADATA_LIMIT, Store
from marin_data.stores.checksums import mismatch
from marin_data.stores.order import StoreOrder
from marin_data.transfer.versions import fetch_manifest, half_published, versioned

__all__ = ["DOWNLOAD_POLICY", "METADATA_LIMIT", "FileTask", "DownloadPlan", "plan_download"]

# A checksum mismatch is worth a retry too: the bytes may have been damaged in flight.
DOWNLOAD_POLICY = replace(DEFAULT_POLICY, retry_on=(RetryableRemoteError, ShardChecksumError))


@dataclass(frozen=True)
class FileTask:
    path: str
    bytes: int
    sha256: str | None  # None: nothing states the file's digest (a Levanter cache nobody pinned): size only
    subset: str | None = None  # None for a metadata file
    checksums: tuple[tuple[str, str], ...] = ()  # other digests the store vouches for (`ObjectInfo.checksums`)

    def expected(self) -> dict[str, str]:
        """``algorithm -> hex`` of every digest stated for the file (`marin_data.stores.checksums`)."""
        return {**dict(self.checksums), **({"sha256": self.sha256} if self.sha256 else {})}

    def mismatch(self, digests: dict[str, str]) -> str | None:
        """The algorithm whose stated digest ``digests`` (of bytes of the listed size) contradicts; None: the
        bytes are the file."""
        return mismatch(self.expected(), digests)


@dataclass(frozen=True)
class DownloadPlan:
    """What a download would fetch: `download` with ``dry_run=True`` returns it alone."""

    source: str
    manifest_sha256: str
    subsets: tuple[str, ...]
    files: tuple[FileTask, ...]  # metadata files first, then the chosen subsets' shards
    tokens: int

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def plan_download(
    stores: StoreOrder | Sequence[Store], *, subsets: Sequence[str] | None, manifest_sha256: str | None = None,
    policy: RetryPolicy = DOWNLOAD_POLICY, known_manifest: bytes | None = None,
) -> tuple[DownloadPlan, bytes, bytes]:
    """Read and check the manifest and shard index from the first store of ``stores`` (in their order of the
    moment: `StoreOrder`) that serves them; resolve ``subsets``. ``known_manifest``: the primary store's
    ``manifest.json``, already read (its format told from it): checked as if read again, not read again.

    Returns:
        The plan, and the verbatim bytes of ``manifest.json`` and ``shards.parquet``.

    Raises:
        ManifestHashMismatchError: no store has a manifest matching ``manifest_sha256``.
        InvalidManifestError: (and `UnsafePathError`) a malformed manifest or index, or one naming paths
            outside the corpus; ``subsets`` matching nothing.
        RemoteError: no store could serve them.
    """
    order = StoreOrder.of(stores)
    primary = order.primary
    pinned = manifest_sha256.strip().lower() if manifest_sha256 else None
    manifest_bytes, digest = _from_first(
        order, lambda s, p: _fetch_manifest(s, pinned, p, known_manifest if s is primary else None), policy)
    manifest = Manifest.from_json(manifest_bytes, f"{primary.url}/{MANIFEST}")
    rec = manifest.files.get(SHARDS_INDEX)
    if rec is None:
        raise InvalidManifestError(f"manifest does not list {SHARDS_INDEX}", path=primary.describe(MANIFEST))
    task = FileTask(SHARDS_INDEX, rec.bytes, rec.sha256)
    index_bytes = _from_first(order.using(lambda s: versioned(s, manifest_bytes)), lambda s, p: _index(s, task, p),
                              policy)
    shards = read_shard_index(index_bytes, metadata=manifest.files)
    chosen = select_subsets(manifest.subsets, list(subsets or []))
    wanted = set(chosen)
    picked = [s for s in shards if s.subset in wanted]
    files: dict[str, FileTask] = {p: FileTask(p, r.bytes, r.sha256) for p, r in sorted(manifest.files.items())}
    files.update((s.path, FileTask(s.path, s.bytes, s.sha256, s.subset)) for s in picked)
    plan = DownloadPlan(source=primary.url, manifest_sha256=digest, subsets=tuple(chosen),
                        files=tuple(files.values()), tokens=sum(s.tokens for s in picked))
    return plan, manifest_bytes, index_bytes


def _fetch_manifest(store: Store, pinned: str | None, policy: RetryPolicy, known: bytes | None) -> tuple[bytes, str]:
    """`fetch_manifest`, parsed too: a store serving garbage fails here, so the next store is tried."""
    data, digest = fetch_manifest(store, pinned, policy, known)
    Manifest.from_json(data, store.describe(MANIFEST))
    return data, digest


def _index(store: Store, task: FileTask, policy: RetryPolicy) -> bytes:
    """The shard index the manifest lists. One the store lacks or holds with other bytes (after the retries
    a damaged transfer deserves) is a copy caught mid-publish: `PublishInProgressError`."""
    try:
        return retry_call(lambda: _checked_bytes(store, task), policy=policy, what=store.describe(task.path))
    except ShardChecksumError as e:
        raise half_published(store, task.path, e.message) from e
    except RemoteError as e:  # no such file, or one larger than listed (refused as it arrived)?
        have = None if e.status == 404 else retry_call(lambda: store.head(task.path), policy=policy,
                                                        what=store.describe(task.path))
        if e.status == 404 or (have is not None and have.size != task.bytes):
            held = "the store does not hold it" if have is None else f"{have.size} bytes, {task.bytes} listed"
            raise half_published(store, task.path, held) from e
        raise


def _from_first(order: StoreOrder, get: Callable, policy: RetryPolicy):
    """``get(store, policy)`` (which retries under the policy it is given) from the first store where it
    succeeds, in ``order``; else re-raise the error of the store tried first."""
    errors: list[BaseException] = []
    for store, tried in order.tries(policy):
        try:
            return get(store, tried)
        except (RemoteError, ShardChecksumError, InvalidManifestError) as e:
            errors.append(e)
    raise errors[0]


def _checked_bytes(store: Store, task: FileTask) -> bytes:
    data = store.read_bytes(task.path, limit=max(task.bytes, 1))
    digest = hashlib.sha256(data).hexdigest()
    if (digest, len(data)) != (task.sha256, task.bytes):
        raise ShardChecksumError(f"sha256/size {digest[:12]}…/{len(data)} != {task.sha256[:12]}…/{task.bytes} "
                                 "listed in the manifest", path=store.describe(task.path),
                                 expected=task.sha256, actual=digest)
    return data
