"""``publish``: upload a local corpus to a store so that the store itself proves every file's content.

Each file goes up whole, in one ``put`` (for S3: one ``put_object`` with ``ChecksumSHA256``; docs/design.md says
why multipart cannot give a full-object SHA-256), so its size is checked against the store's single-request
limit before anything is sent. Files the store already holds with the same size and SHA-256 are skipped,
which makes an interrupted publish resumable and a repeated one free.

Order, and why (publishing a new version over an old one is atomic for readers: `marin_data.transfer.versions`):

1. The version the store serves now is kept (`keep_published`): its manifest and listed files get their
   content names (``by-sha256/<sha256>/<name>``) if they lack them, so its pin still reads after the flip.
   A shard that would replace one of its shards with other bytes is refused before anything is sent.
2. Every shard, and every file the manifest lists and the manifest itself under their content names, in
   parallel. Each local file is hashed first: a file that no longer matches the manifest is refused rather
   than published (moto and some S3-compatible stores accept a wrong ``ChecksumSHA256`` silently). A store
   that refuses us (no such bucket, no permission) stops the publish at the first refusal, reported once.
3. ``manifest.json``, only when everything else is up: the flip. A reader that finds it finds every file it
   names by content. It is published byte for byte: publishing never changes it, so the sha256 users pin
   with ``--manifest-sha256`` is the same on every mirror and before and after any publish.
4. The plain names of the listed files (and the datasheet), for readers that know no content names.
5. The store's own sizes and SHA-256s are checked against the manifest (`verify_remote`, no data read);
   only then is the store added to the local ``mirrors.json`` (`marin_data.corpus.mirrors`), which the
   datasheet lists. A failed publish records nothing.

A kill at any point leaves the store serving the old version whole (before 3) or the new one (after): a
re-run finishes the publish, skipping what is there.

The datasheet states the manifest's digest, so the manifest cannot list it (`marin_data.docs.write`); it is
uploaded too when present, and refused when it states another digest (it would tell readers to pin a
value that does not verify): run ``marin-data datasheet`` first.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from marin_data.fileio.atomic import sha256_file
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
from marin_data.fileio.lock import corpus_lock
from marin_data.retry import DEFAULT_POLICY, RetryPolicy, retry_call
from marin_data.stores import open_store
from marin_data.stores.base import Store
from marin_data.transfer.apart import refuse_publish
from marin_data.transfer.remote_verify import verify_remote
from marin_data.transfer.versions import KeptFile, content_path, keep_published
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
    path: str  # in the store
    bytes: int
    sha256: str
    src: str | None = None  # the local file, relative to the corpus, when not ``path`` (a content name's)

    @property
    def local(self) -> str:
        return self.src or self.path


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
    refuse_publish(corpus)  # a pin kept apart from its data: its shards are not here
    check_datasheet(corpus.root, corpus.manifest_sha256)
    store = open_store(to, max_connections=workers + 2, **store_options)
    shards = [_Upload(s.path, s.bytes, s.sha256) for s in corpus.shards]
    listed = [_Upload(p, r.bytes, r.sha256) for p, r in sorted(corpus.manifest.files.items())]
    plain = [*listed, *_unlisted_documents(corpus.root)]
    _check_sizes([*shards, *plain], single_put_limit or store.max_put_bytes, store)

    t0 = time.perf_counter()
    with corpus_lock(corpus.root):
        finish_commit(corpus.root)  # a commit a kill left moving in: its files, not a mix, are uploaded
        corpus = load_corpus(corpus.root, manifest_sha256=corpus.manifest_sha256)  # unchanged since checked
        manifest = _Upload(MANIFEST, (corpus.root / MANIFEST).stat().st_size, corpus.manifest_sha256)
        copies = [_Upload(content_path(f.sha256, f.path), f.bytes, f.sha256, src=f.path) for f in [*listed, manifest]]
        _put_kept(store, keep_published(store, corpus.manifest_sha256, corpus.shards, policy), policy)
        uploaded, skipped, nbytes = _upload_step(corpus.root, [*shards, *copies], store, workers, policy, progress,
                                                 "manifest.json was not uploaded")
        if _put_if_changed(corpus.root, manifest, store, policy):  # the flip
            uploaded, nbytes = (*uploaded, MANIFEST), nbytes + manifest.bytes
        else:
            skipped = (*skipped, MANIFEST)
        more = _upload_step(corpus.root, plain, store, workers, policy, progress,
                            "the manifest is published; run the same command again for their plain names")
        uploaded, skipped, nbytes = (*uploaded, *more[0]), (*skipped, *more[1]), nbytes + more[2]
        check_published(corpus.root, to, [{**store.mirror_record(), "subsets": sorted(corpus.manifest.subsets)}],
                        workers=workers, policy=policy, **store_options)
    return PublishReport(url=store.url, manifest_sha256=manifest.sha256, uploaded=tuple(uploaded),
                         skipped=tuple(skipped), bytes_uploaded=nbytes, seconds=time.perf_counter() - t0)


def _upload_step(root: Path, files: list[_Upload], store: Store, workers: int, policy: RetryPolicy,
                 progress: bool | None, then: str) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """Upload ``files`` (`_upload_all`); raise `TransferFailedError` (ending with ``then``) if any failed."""
    uploaded, skipped, failed, nbytes = _upload_all(root, files, store, workers, policy, progress)
    if failed:
        lines = "".join(f"\n  {p}: {why}" for p, why in failed)
        raise TransferFailedError(f"{len(failed)} of {len(files)} uploads failed; {then}:{lines}", path=store.url,
                                  failures=failed)
    return tuple(uploaded), tuple(skipped), nbytes


def _put_kept(store: Store, kept: list[KeptFile], policy: RetryPolicy) -> None:
    """Upload the files of the served version that `keep_published` read (bytes in memory: metadata)."""
    with tempfile.TemporaryDirectory(prefix="marin-publish-") as tmp:
        for k in kept:
            src = Path(tmp) / "kept"
            src.write_bytes(k.data)
            retry_call(partial(store.put, k.path, src, sha256=k.sha256, size=len(k.data)), policy=policy,
                       what=store.describe(k.path))


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
    digest, size = sha256_file(root / f.local)
    if (digest, size) != (f.sha256, f.bytes):
        raise ShardChecksumError(f"the local file no longer matches the manifest (sha256/size {digest[:12]}…/"
                                 f"{size} != {f.sha256[:12]}…/{f.bytes}); not uploaded", path=f.path,
                                 expected=f.sha256, actual=digest)
    retry_call(lambda: store.put(f.path, root / f.local, sha256=f.sha256, size=f.bytes), policy=policy, what=what)
    return True
