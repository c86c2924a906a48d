"""``publish``: upload a local corpus to a store so that the store itself proves every file's content.

Each file goes up whole, in one ``put`` (for S3: one ``put_object`` with ``ChecksumSHA256``; docs/design.md says
why multipart cannot give a full-object SHA-256), so its size is checked against the store's single-request
limit before anything is sent. Files the store already holds with the same size and SHA-256 are skipped,
which makes an interrupted publish resumable and a repeated one free.

Order, and why:

1. Every shard and metadata file, in parallel. Each local file is hashed first: a file that no longer
   matches the manifest is refused rather than published (moto and some S3-compatible stores accept a
   wrong ``ChecksumSHA256`` silently). A store that refuses us (no such bucket, no permission) stops the
   publish at the first refusal, reported once.
2. ``manifest.json`` last, only when everything else is up: a reader that finds the manifest finds every
   file it names. It is published byte for byte: publishing never changes it, so the sha256 users pin
   with ``--manifest-sha256`` is the same on every mirror and before and after any publish.
3. The store's own sizes and SHA-256s are checked against the manifest (`verify_remote`, no data read);
   only then is the store added to the local ``mirrors.json`` (`marin_data.corpus.mirrors`), which the
   datasheet lists. A failed publish records nothing.

The datasheet states the manifest's digest, so the manifest cannot list it (`marin_data.docs.write`); it is
uploaded too when present, and refused when it states another digest (it would tell readers to pin a
value that does not verify): run ``marin-data datasheet`` first.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from marin_data.atomic import sha256_file
from marin_data.corpus.commit import finish_commit
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.mirrors import record_mirrors
from marin_data.errors import (
    MarinDataError,
    ObjectTooLargeError,
    RemoteError,
    RetryableRemoteError,
    ShardChecksumError,
    StaleDatasheetError,
    TransferFailedError,
)
from marin_data.layout import MANIFEST, UNLISTED
from marin_data.lock import corpus_lock
from marin_data.retry import DEFAULT_POLICY, RetryPolicy, retry_call
from marin_data.stores import open_store
from marin_data.stores.base import Store
from marin_data.transfer.remote_verify import verify_remote
from marin_data.ui import human_bytes, plural, progress as progress_bar

__all__ = ["PublishReport", "publish", "check_datasheet", "check_published"]


@dataclass(frozen=True)
class PublishReport:
    url: str
    manifest_sha256: str  # the root of trust of what was published
    uploaded: tuple[str, ...]
    skipped: tuple[str, ...]  # already in the store with the same size and SHA-256
    bytes_uploaded: int
    seconds: float


@dataclass(frozen=True)
class _Upload:
    path: str
    bytes: int
    sha256: str


def publish(
    root: str | os.PathLike,
    *,
    to: str,
    workers: int = 8,
    single_put_limit: int | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
    progress: bool | None = None,
    **store_options,
) -> PublishReport:
    """Upload the corpus at ``root`` to the store at ``to``, check it there, and record it as a mirror.

    Args:
        root: a local corpus directory.
        to: the store URL (``s3://bucket/prefix``).
        workers: files uploaded in parallel.
        single_put_limit: the largest file one upload may carry; default the store's own limit (S3: 5 GiB).
        policy: retry knobs.
        progress: show a progress bar; None shows it when stderr is a terminal.
        **store_options: for `open_store` (``endpoint_url``, ``profile``, ``s3_compat``...).

    Returns:
        A `PublishReport` with the published manifest's sha256.

    Raises:
        ObjectTooLargeError: some file exceeds the single-upload limit; nothing was uploaded or changed.
        ShardChecksumError: a local file no longer matches the manifest (re-create it); not uploaded.
        StaleDatasheetError: the datasheet states another manifest digest; nothing was uploaded.
        TransferFailedError: some uploads failed after every retry (the manifest was not uploaded), or the
            store does not hold what was sent.
        RemoteError: the store cannot be reached or refuses us.
    """
    corpus = load_corpus(root)
    check_datasheet(corpus.root, corpus.manifest_sha256)
    store = open_store(to, max_connections=workers + 2, **store_options)
    files = [_Upload(s.path, s.bytes, s.sha256) for s in corpus.shards]
    files += [_Upload(p, r.bytes, r.sha256) for p, r in sorted(corpus.manifest.files.items())]
    files += _unlisted_documents(corpus.root)
    _check_sizes(files, single_put_limit or store.max_put_bytes, store)

    t0 = time.perf_counter()
    with corpus_lock(corpus.root):
        finish_commit(corpus.root)  # a commit a kill left moving in: its files, not a mix, are uploaded
        corpus = load_corpus(corpus.root, manifest_sha256=corpus.manifest_sha256)  # unchanged since checked
        uploaded, skipped, failed, nbytes = _upload_all(corpus.root, files, store, workers, policy, progress)
        if failed:
            lines = "".join(f"\n  {p}: {why}" for p, why in failed)
            raise TransferFailedError(f"{len(failed)} of {len(files)} uploads failed; manifest.json was not "
                                      f"uploaded:{lines}", path=store.url, failures=failed)
        manifest = _Upload(MANIFEST, *reversed(sha256_file(corpus.root / MANIFEST)))
        if _put_if_changed(corpus.root, manifest, store, policy):
            uploaded, nbytes = (*uploaded, MANIFEST), nbytes + manifest.bytes
        else:
            skipped = (*skipped, MANIFEST)
        check_published(corpus.root, to, [{**store.mirror_record(), "subsets": sorted(corpus.manifest.subsets)}],
                        workers=workers, policy=policy, **store_options)
    return PublishReport(url=store.url, manifest_sha256=manifest.sha256, uploaded=tuple(uploaded),
                         skipped=tuple(skipped), bytes_uploaded=nbytes, seconds=time.perf_counter() - t0)


def check_datasheet(root: Path, manifest_sha256: str) -> None:
    """Refuse to publish a datasheet that states another manifest digest than the one being published."""
    for rel in UNLISTED:
        path = root / rel
        if path.is_file() and manifest_sha256 not in path.read_text(errors="replace"):
            raise StaleDatasheetError(f"{rel} does not state the manifest's sha256 {manifest_sha256}: readers "
                                      "would pin a value that does not verify", path=str(path),
                                      expected=manifest_sha256)


def check_published(root: Path, url: str, records: list[dict], **verify_options) -> None:
    """Compare what the store at ``url`` holds with the manifest (no data read); record ``records`` in
    ``mirrors.json`` only when it holds every file, byte for byte."""
    report = verify_remote(root, url, **verify_options)
    if not report.ok:
        lines = "".join(f"\n  {p.path}: {p.message}" for p in report.problems[:10])
        raise TransferFailedError(f"{url} does not hold what was published "
                                  f"({plural(len(report.problems), 'problem')}); not recorded as a mirror:{lines}",
                                  path=url,
                                  failures=[(p.path, p.message) for p in report.problems])
    record_mirrors(root, records)


def _unlisted_documents(root: Path) -> list[_Upload]:
    """The corpus files the manifest cannot list (the datasheet), as present on disk."""
    return [_Upload(p, *reversed(sha256_file(root / p))) for p in UNLISTED if (root / p).is_file()]


def _check_sizes(files: list[_Upload], limit: int | None, store: Store) -> None:
    too_big = [f for f in files if limit is not None and f.bytes > limit]
    if too_big:
        names = ", ".join(f"{f.path} ({human_bytes(f.bytes)})" for f in too_big[:5])
        more = f" and {len(too_big) - 5} more" if len(too_big) > 5 else ""
        raise ObjectTooLargeError(
            f"{plural(len(too_big), 'file')} over the {human_bytes(limit)} a single upload to {store.url} may carry, "
            f"and only a single upload stores a full-object SHA-256: {names}{more}",
            path=too_big[0].path, expected=limit, actual=too_big[0].bytes)


def _upload_all(root: Path, files: list[_Upload], store: Store, workers: int, policy: RetryPolicy,
                progress: bool | None):
    bar = progress_bar(sum(f.bytes for f in files), "publish", unit="B", unit_scale=True,
                       disable=None if progress is None else not progress)
    lock = threading.Lock()
    refusals: list[RemoteError] = []

    def one(f: _Upload) -> tuple[bool, str | None]:
        if refusals:
            return False, "not sent: the store refused an earlier upload"
        try:
            sent = _put_if_changed(root, f, store, policy)
        except RemoteError as e:
            if not isinstance(e, RetryableRemoteError):  # no bucket, no permission: every file would fail alike
                refusals.append(e)
            return False, str(e.message)
        except MarinDataError as e:
            return False, str(e.message)
        finally:
            with lock:
                bar.update(f.bytes)
        return sent, None

    try:
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="publish") as pool:
            results = list(pool.map(one, files))
    finally:
        bar.close()
    if refusals:
        raise refusals[0]
    failed = [(f.path, why) for f, (_, why) in zip(files, results) if why is not None]
    uploaded = [f.path for f, (sent, why) in zip(files, results) if sent and why is None]
    skipped = [f.path for f, (sent, why) in zip(files, results) if not sent and why is None]
    sent = set(uploaded)
    return uploaded, skipped, failed, sum(f.bytes for f in files if f.path in sent)


def _put_if_changed(root: Path, f: _Upload, store: Store, policy: RetryPolicy) -> bool:
    """Upload one file unless the store already holds it; True when it was sent."""
    what = store.describe(f.path)
    have = retry_call(lambda: store.head(f.path), policy=policy, what=what)
    if have is not None and have.size == f.bytes and have.sha256 == f.sha256:
        return False
    digest, size = sha256_file(root / f.path)
    if (digest, size) != (f.sha256, f.bytes):
        raise ShardChecksumError(f"the local file no longer matches the manifest (sha256/size {digest[:12]}…/"
                                 f"{size} != {f.sha256[:12]}…/{f.bytes}); not uploaded", path=f.path,
                                 expected=f.sha256, actual=digest)
    retry_call(lambda: store.put(f.path, root / f.path, sha256=f.sha256, size=f.bytes), policy=policy, what=what)
    return True
