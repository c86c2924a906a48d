"""``verify --remote``: compare what a pin lists with what a store holds, from the store's own checksums, or
(``deep``) from the bytes themselves.

The pin is a local corpus's manifest (`verify_remote`: ``verify LOCAL --remote URL``) or a published one's
(`published_listing`: ``verify PIN --remote``); either becomes a `Listing` of every file to check (the
chosen subsets' shards, the metadata files, ``manifest.json`` itself) that `check_listing` compares with the
store holding the data and the one holding the pin's own files (the same store unless a pin is kept apart).

Without ``deep`` no data is downloaded: one ``head`` per file (for S3, ``HeadObject`` with
``ChecksumMode=ENABLED``, which returns the full-object SHA-256 the store computed at upload, or our
``sha256`` user metadata where a store keeps no checksum; for a Hugging Face repo, one tree listing: LFS
sha256s, and git blob SHA-1s for regular files, compared with the local file's; through GCS, whose objects
carry no SHA-256, ``x-goog-hash``'s MD5 or CRC32C compared with the local file's). It answers "does this
mirror hold exactly the corpus I have?", including ``manifest.json`` itself (the root of trust) and the
copies by content (``by-sha256/``) that readers pinned to it read, where the store keeps them. With
``deep`` every file is streamed and re-hashed (`marin_data.transfer.rehash`), one job per file on an engine
(threads here, or Ray tasks): what a store's metadata cannot show (an object rewritten with its old
checksum metadata kept) is caught.

The report is `marin_data.corpus.verify.VerifyReport`, so the CLI prints local and remote checks alike:
``missing``, ``truncated``/``oversized`` (sizes differ), ``modified`` (same size, other digest), and
``unreadable`` for an object whose store reports no digest to compare (a multipart upload without our
metadata): ``deep`` reads it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.names import select_subsets
from marin_data.corpus.verify import Problem, ProblemKind, VerifyReport
from marin_data.engines import run_jobs
from marin_data.fileio.atomic import sha256_file
from marin_data.layout import MANIFEST
from marin_data.retry import DEFAULT_POLICY, RetryPolicy, retry_call
from marin_data.stores import open_store
from marin_data.stores.base import ObjectInfo, Store
from marin_data.stores.checksums import file_digests, strongest
from marin_data.stores.hub_ids import git_blob_sha1_file
from marin_data.transfer.plan import plan_download
from marin_data.transfer.rehash import HashJob, run_job
from marin_data.transfer.versions import content_path

__all__ = ["REMOTE_WORKERS", "Listing", "verify_remote", "local_listing", "published_listing", "check_listing"]

REMOTE_WORKERS = 16  # requests at once: a remote check waits on round trips, not on cores
Listed = tuple[str, int, str]  # (path, bytes, sha256)


@dataclass(frozen=True)
class Listing:
    """Every file a pin lists for the chosen subsets: ``shards`` (in the store holding the data) and ``files``
    (the metadata files and ``manifest.json``, in the pin's store), each `Listed`. ``local``: a folder on this
    machine holding the same files, which stand in where a store states a digest only in its own form (a git
    blob id, an MD5, a CRC32C); None for a pin read from a store."""

    root: str
    manifest_sha256: str
    subsets: tuple[str, ...]
    shards: tuple[Listed, ...]
    files: tuple[Listed, ...]
    local: Path | None = None
    data: str | None = None  # the manifest's ``data``: where a pin kept apart from its data has its shards


def verify_remote(
    root: str | os.PathLike,
    url: str,
    *,
    subsets: Iterable[str] | None = None,
    manifest_sha256: str | None = None,
    workers: int = REMOTE_WORKERS,
    policy: RetryPolicy = DEFAULT_POLICY,
    deep: bool = False,
    engine: str = "local",
    engine_address: str | None = None,
    **store_options,
) -> VerifyReport:
    """Check that the store at ``url`` holds the files the local corpus at ``root`` lists.

    Args:
        root: the local corpus whose manifest is the reference.
        url: the published copy (``s3://bucket/prefix``, ``hf://datasets/org/name``).
        subsets: names or globs of the subsets whose shards to check; None: every subset. The metadata
            files and ``manifest.json`` are always checked.
        manifest_sha256: the pinned sha256 of the local ``manifest.json``.
        workers: parallel requests (``deep``: files hashed at once).
        policy: retry knobs.
        deep: re-hash every byte instead of asking the store (`check_listing`).
        engine, engine_address: where ``deep`` runs its jobs (`marin_data.engines.run_jobs`).
        **store_options: for `open_store` (``endpoint_url``, ``anonymous``, ``requester_pays``...).

    Returns:
        A `VerifyReport` (``bytes_checked``: the bytes the store vouched for, or with ``deep`` the bytes read).

    Raises:
        InvalidManifestError: the local manifest cannot be trusted.
        RemoteError: the store cannot be reached or refuses us (after retries).
    """
    listing = local_listing(root, subsets=subsets, manifest_sha256=manifest_sha256)
    listing, data, pin = held_by(listing, open_store(url, max_connections=workers + 2, **store_options), store_options,
                                 workers)
    return check_listing(listing, data=data, pin=pin, options=store_options, workers=workers, policy=policy,
                         deep=deep, engine=engine, engine_address=engine_address)


def held_by(listing: Listing, store: Store, options: dict[str, Any],
            workers: int | None = None) -> tuple[Listing, Store, Store]:
    """What of ``listing`` the copy published at ``store`` holds, and where: ``(listing, data, pin)`` for
    `check_listing`. A pin kept apart from its data (``listing.data``) has its shards in the data's store
    (opened with ``options``); ``store`` being that very store, it holds the shards only."""
    if not listing.data:
        return listing, store, store
    if store.url.rstrip("/") == listing.data.rstrip("/"):
        return replace(listing, files=()), store, store
    return listing, open_store(listing.data, max_connections=(workers or REMOTE_WORKERS) + 2, **options), store


def local_listing(root: str | os.PathLike, *, subsets: Iterable[str] | None = None,
                  manifest_sha256: str | None = None) -> Listing:
    """What the local corpus at ``root`` lists for ``subsets`` (all when None)."""
    corpus = load_corpus(root, manifest_sha256=manifest_sha256)
    chosen = select_subsets(corpus.manifest.subsets, list(subsets or []))
    files = [(p, r.bytes, r.sha256) for p, r in sorted(corpus.manifest.files.items())]
    files.append((MANIFEST, *reversed(sha256_file(corpus.root / MANIFEST))))
    return Listing(str(corpus.root), corpus.manifest_sha256, tuple(chosen),
                   tuple((s.path, s.bytes, s.sha256) for s in corpus.shards_of(chosen)), tuple(files), corpus.root,
                   corpus.manifest.data)


def published_listing(store: Store, *, subsets: Iterable[str] | None = None,
                      manifest_sha256: str | None = None) -> Listing:
    """What the pin published at ``store`` lists for ``subsets`` (all when None): its manifest (checked
    against ``manifest_sha256`` when given) and shard index read as a download's plan reads them."""
    plan, manifest_bytes, _ = plan_download([store], subsets=list(subsets or []) or None,
                                            manifest_sha256=manifest_sha256)
    files = [(f.path, f.bytes, f.sha256) for f in plan.files if f.subset is None]
    files.append((MANIFEST, len(manifest_bytes), plan.manifest_sha256))
    data = Manifest.from_json(manifest_bytes, store.describe(MANIFEST)).data
    return Listing(store.url, plan.manifest_sha256, plan.subsets,
                   tuple((f.path, f.bytes, f.sha256) for f in plan.files if f.subset is not None), tuple(files),
                   data=data)


def check_listing(listing: Listing, *, data: Store, pin: Store, options: dict[str, Any], workers: int | None = None,
                  policy: RetryPolicy = DEFAULT_POLICY, deep: bool = False, engine: str = "local",
                  engine_address: str | None = None, also: Sequence[Callable[[], list[Problem]]] = ()) -> VerifyReport:
    """Compare ``listing`` with the stores: its shards with ``data``, its own files (and their copies by
    content, where ``pin`` keeps them) with ``pin``; ``options``: what both were opened with (the jobs of
    ``deep`` open them again, wherever they run). ``also``: more jobs of ``deep`` (picklable, each returning
    its findings: a format's own checks of what it re-hashed), run beside the hashing on the same engine."""
    t0 = time.perf_counter()
    targets = [(data, t) for t in listing.shards] + [(pin, t) for t in listing.files]
    # The copies by content that readers pinned to this version read (`marin_data.transfer.versions`),
    # checked where the store has them (a copy published before they existed has none).
    copies: dict[str, Listed] = {content_path(sha, path): (path, size, sha) for path, size, sha in listing.files}
    if deep:
        problems, files, nbytes, workers = _rehashed(targets, copies, pin, options, workers, policy, engine,
                                                     engine_address, also)
    else:
        if engine != "local" or engine_address:
            raise ValueError("the store's own checksums are asked from here: an engine runs --deep's jobs only")
        workers = workers or REMOTE_WORKERS
        problems, files, nbytes = _headed(targets, copies, pin, listing.local, workers, policy)
    return VerifyReport(
        root=listing.root, manifest_sha256=listing.manifest_sha256, subsets=listing.subsets, deep=deep,
        files_checked=files, bytes_checked=nbytes, seconds=time.perf_counter() - t0, workers=workers,
        problems=tuple(sorted(problems, key=lambda p: p.path)), partial_files=(),
    )


def _headed(targets: list[tuple[Store, Listed]], copies: dict[str, Listed], pin: Store, local: Path | None,
            workers: int, policy: RetryPolicy) -> tuple[list[Problem], int, int]:
    """One ``head`` per file: the findings, the files compared and the bytes the store vouched for."""
    asked = [(store, t[0]) for store, t in targets] + [(pin, name) for name in copies]
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify-remote") as pool:
        heads = list(pool.map(lambda sp: retry_call(lambda: sp[0].head(sp[1]), policy=policy,
                                                    what=sp[0].describe(sp[1])), asked))
    checked = [(store, t, _as_local(local, t[0], t[2], h)) for (store, t), h in zip(targets, heads)]
    checked += [(pin, (name, *copies[name][1:]), _as_local(local, copies[name][0], copies[name][2], h))
                for name, h in zip(copies, heads[len(targets):]) if h is not None]
    problems = [p for store, t, h in checked if (p := _compare(store, *t, h)) is not None]
    return problems, len(checked), sum(t[1] for _, t, h in checked if h is not None)


def _rehashed(targets: list[tuple[Store, Listed]], copies: dict[str, Listed], pin: Store, options: dict[str, Any],
              workers: int | None, policy: RetryPolicy, engine: str, address: str | None,
              also: Sequence[Callable[[], list[Problem]]]) -> tuple[list[Problem], int, int, int]:
    """Every file streamed and re-hashed, one job each on ``engine`` (and the jobs ``also``): findings, files,
    bytes read, workers."""
    workers = workers or (REMOTE_WORKERS if engine == "local" else None)
    opened = tuple(sorted({**options, **({"max_connections": workers + 2} if engine == "local" else {})}.items()))
    jobs = [HashJob(store.reopen_url(), opened, *t, policy=policy) for store, t in targets]
    jobs += [HashJob(pin.reopen_url(), opened, name, size, sha, optional=True, policy=policy)
             for name, (_, size, sha) in copies.items()]
    jobs.sort(key=lambda j: -j.bytes)  # largest first: the last file to start is a small one
    results, ran = run_jobs(run_job, [*jobs, *also], engine=engine, workers=workers, address=address)
    counted = [r for j, r in zip(jobs, results) if r.present or not j.optional]
    found = [r.problem for r in counted if r.problem] + [p for more in results[len(jobs):] for p in more]
    return found, len(counted), sum(r.bytes for r in counted), ran


def _as_local(root: Path | None, path: str, sha256: str, have: ObjectInfo | None) -> ObjectInfo | None:
    """A store that states no SHA-256 it computed may state another digest: a Hugging Face repo a regular
    (non-LFS) file's git blob SHA-1, GCS (through its S3 endpoint) an MD5 and a CRC32C, S3 the MD5 of a
    single-part upload's ETag. When it matches the local file ``path``'s, and that file matches the manifest,
    the store holds the listed SHA-256 too (reading the local file costs no download). Our ``sha256``
    metadata is only what the publisher wrote: where the store computed a digest of its own, that digest
    decides (an object rewritten under its old metadata is caught)."""
    if have is None or root is None or not (root / path).is_file():
        return have
    if have.sha256 is not None and (have.sha256_source != "metadata" or not have.checksums):
        return have
    local = root / path
    if have.git_sha1 is not None:
        same = git_blob_sha1_file(local) == have.git_sha1 and sha256_file(local)[0] == sha256
        return replace(have, sha256=sha256 if same else f"(git blob {have.git_sha1})", sha256_source="git blob SHA-1")
    algorithm = strongest(a for a, _ in have.checksums)
    if algorithm is None:
        return have
    stated = dict(have.checksums)[algorithm]
    digests, _ = file_digests(local, also=[algorithm])
    same = digests[algorithm] == stated and digests["sha256"] == sha256
    return replace(have, sha256=sha256 if same else f"({algorithm} {stated})",
                   sha256_source=f"the store's {algorithm}, against the local file's")


def _compare(store: Store, path: str, size: int, sha256: str, have: ObjectInfo | None) -> Problem | None:
    want = {"bytes": size, "sha256": sha256}
    where = store.describe(path)
    if have is None:
        return Problem(path, ProblemKind.MISSING, f"not in {store.url}", expected=want)
    got = {"bytes": have.size, "sha256": have.sha256}
    if have.size != size:
        kind = ProblemKind.TRUNCATED if have.size < size else ProblemKind.OVERSIZED
        return Problem(path, kind, f"{where} is {have.size} bytes, {size} listed", want, got)
    if have.sha256 is None:
        return Problem(path, ProblemKind.UNREADABLE, f"{where} has no full-object SHA-256 in the store (uploaded "
                       "multipart or without marin's metadata): republish it, or --deep reads its bytes", want, got)
    if have.sha256 != sha256:
        return Problem(path, ProblemKind.MODIFIED, f"{where} has sha256 {have.sha256[:12]}…, "
                       f"{sha256[:12]}… listed ({have.sha256_source})", want, got)
    return None
