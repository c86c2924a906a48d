"""Published versions: every manifest and every file it lists is also stored under its content, so that
publishing a new version never breaks a reader of the one before it.

Beside the corpus layout, a store holds ``by-sha256/<sha256>/<name>``: each file a manifest lists
(``shards.parquet``, ``SHA256SUMS``, ``tokenizer.json``, the card...) and the manifest itself, under the
SHA-256 of its bytes. Such a name never changes content, so:

- a reader fetches ``manifest.json`` (the version the store serves now) or, pinned to another digest,
  ``by-sha256/<pin>/manifest.json`` (`fetch_manifest`), then every file that manifest lists by its content
  name (`VersionedStore`), never a plain name that a publish may be rewriting under it;
- publish uploads them before it replaces ``manifest.json`` (the flip), then refreshes the plain names,
  which readers that know no content names use (``sha256sum -c``, older marin, the Hub's dataset viewer);
  before its first upload it keeps the version the store serves (`keep_published`), also one published
  before content names existed, so that its pin still reads after the flip;
- a copy published before content names existed has none: its plain names are read, as they always were.
The manifest names no content name: the pinned digest of a corpus is the same as before they existed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from marin_data.corpus.index import read_shard_index
from marin_data.corpus.manifest import Manifest
from marin_data.corpus.records import ShardRecord
from marin_data.errors import (
    CorpusConflictError,
    InvalidManifestError,
    ManifestHashMismatchError,
    PublishInProgressError,
    RemoteError,
)
from marin_data.layout import BY_SHA256, MANIFEST, SHARDS_INDEX
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores.base import METADATA_LIMIT, ObjectInfo, ReadStream, Store

__all__ = ["KeptFile", "VersionedStore", "content_path", "fetch_manifest", "half_published", "keep_published",
           "versioned"]

_ABSENT = (403, 404)  # S3 answers 403 for a missing key to a reader without ListBucket permission


def content_path(sha256: str, path: str) -> str:
    """Where a store keeps the file ``path`` whose bytes have this SHA-256: ``by-sha256/<sha256>/<name>``. The
    name keeps its extension, so the Hub stores the copy as it stores the original (LFS or git)."""
    return f"{BY_SHA256}/{sha256}/{path.rpartition('/')[2]}"


def fetch_manifest(store: Store, pinned: str | None, policy: RetryPolicy,
                   known: bytes | None = None) -> tuple[bytes, str]:
    """The bytes and sha256 of the manifest ``store`` serves, or of the one ``pinned``: its content copy
    first, else ``manifest.json`` if that is the pinned one (a copy published before content names existed).
    ``known``: the bytes of ``manifest.json`` already read from ``store`` (not read again).

    Raises:
        ManifestHashMismatchError: the store holds no manifest of the pinned digest.
        RemoteError: it holds no manifest at all, or cannot be read.
    """
    if pinned is not None:
        kept = _read_if_present(store, content_path(pinned, MANIFEST), METADATA_LIMIT, policy)
        if kept is not None and hashlib.sha256(kept).hexdigest() == pinned:
            return kept, pinned
    data = known if known is not None else retry_call(lambda: store.read_bytes(MANIFEST, limit=METADATA_LIMIT),
                                                      policy=policy, what=store.describe(MANIFEST))
    digest = hashlib.sha256(data).hexdigest()
    if pinned is not None and digest != pinned:
        raise ManifestHashMismatchError(
            f"manifest sha256 is {digest}, but {pinned} was pinned, and the store keeps no manifest of that "
            f"digest ({content_path(pinned, MANIFEST)}): this copy differs", path=store.describe(MANIFEST),
            expected=pinned, actual=digest)
    return data, digest


class VersionedStore(Store):
    """``store``, reading each file of ``files`` (``path -> sha256``: what one manifest lists, and the manifest
    itself) from its content name where the store has one, else from its plain name."""

    def __init__(self, store: Store, files: Mapping[str, str]) -> None:
        self.store, self.url, self.max_put_bytes = store, store.url, store.max_put_bytes
        self._names = {p: content_path(sha, p) for p, sha in files.items()}

    def list(self, prefix: str = ""):
        return self.store.list(prefix)

    def head(self, path: str) -> ObjectInfo | None:
        kept = self._names.get(path)
        info = self.store.head(kept) if kept is not None else None
        return replace(info, path=path) if info is not None else self.store.head(path)

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        kept = self._names.get(path)
        if kept is not None:
            try:
                return self.store.read(kept, start, end)
            except RemoteError as e:
                if e.status not in _ABSENT:
                    raise
        return self.store.read(path, start, end)

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        self.store.put(path, src, sha256=sha256, size=size)

    def mirror_record(self) -> dict:
        return self.store.mirror_record()

    def describe(self, path: str) -> str:
        return self.store.describe(path)


def versioned(store: Store, manifest_bytes: bytes) -> VersionedStore:
    """``store`` reading the manifest ``manifest_bytes`` (already checked) and each file it lists by content."""
    files = {p: r.sha256 for p, r in Manifest.from_json(manifest_bytes, store.describe(MANIFEST)).files.items()}
    return VersionedStore(store, {**files, MANIFEST: hashlib.sha256(manifest_bytes).hexdigest()})


def half_published(store: Store, path: str, cause: Exception) -> PublishInProgressError:
    """The error for a file the manifest lists that the store does not hold as listed."""
    return PublishInProgressError(
        f"{path} is not the one manifest.json lists ({cause}): this copy is being published, or its publish "
        "was interrupted", path=store.describe(path))


@dataclass(frozen=True)
class KeptFile:
    """A file of the version a store serves, to upload under its content name before a publish flips."""

    path: str  # the content name
    data: bytes
    sha256: str


def keep_published(store: Store, manifest_sha256: str, shards: list[ShardRecord],
                   policy: RetryPolicy) -> list[KeptFile]:
    """What a publish of the manifest ``manifest_sha256`` must add to ``store`` before it flips, so that the
    version the store serves now stays readable by its pin: its manifest and listed files, read from their
    plain names where they have no content copy yet (a copy published before content names existed). A file
    that no longer matches that manifest (a copy already half-published) is left out.

    Raises:
        CorpusConflictError: a shard of ``shards`` would replace a shard of the served version with other
            bytes at the same path: both versions cannot be read from one store.
    """
    try:
        data, digest = fetch_manifest(store, None, policy)
        if digest == manifest_sha256:
            return []
        served = Manifest.from_json(data, store.describe(MANIFEST))
    except RemoteError as e:
        if e.status in _ABSENT:
            return []  # the store holds no corpus yet
        raise
    except InvalidManifestError:
        return []  # nothing readable to keep
    kept = [] if store.head(content_path(digest, MANIFEST)) else [KeptFile(content_path(digest, MANIFEST), data, digest)]
    for path, rec in sorted(served.files.items()):
        copy = content_path(rec.sha256, path)
        present = store.head(copy) is not None
        if present and path != SHARDS_INDEX:
            continue
        source = copy if present else path
        held = retry_call(partial(store.head, source), policy=policy, what=store.describe(source))
        if held is None or held.size != rec.bytes:
            continue  # not the listed file: a copy already half-published
        got = _read_if_present(store, source, max(rec.bytes, 1), policy)
        if got is None or hashlib.sha256(got).hexdigest() != rec.sha256:
            continue
        if not present:
            kept.append(KeptFile(copy, got, rec.sha256))
        if path == SHARDS_INDEX:
            _refuse_replaced_shards(store, digest, read_shard_index(got, metadata=served.files), shards)
    return kept


def _refuse_replaced_shards(store: Store, digest: str, served: list[ShardRecord], ours: list[ShardRecord]) -> None:
    theirs = {s.path: s.sha256 for s in served}
    replaced = [s.path for s in ours if theirs.get(s.path, s.sha256) != s.sha256]
    if replaced:
        raise CorpusConflictError(
            f"{len(replaced)} shard(s) would replace shards of the version {store.url} serves (manifest sha256 "
            f"{digest}) with other bytes at the same path, e.g. {replaced[0]}: readers of that version would "
            "break. Publish to a new prefix or repo (shards of one corpus are appended, never rewritten)",
            path=store.describe(replaced[0]))


def _read_if_present(store: Store, path: str, limit: int, policy: RetryPolicy) -> bytes | None:
    try:
        return retry_call(lambda: store.read_bytes(path, limit=limit), policy=policy, what=store.describe(path))
    except RemoteError as e:
        if e.status in _ABSENT:
            return None
        raise
