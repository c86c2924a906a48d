"""``verify --remote``: compare a local corpus's manifest with a store's own sizes and checksums.

No data is downloaded: one ``head`` per file (for S3, ``HeadObject`` with ``ChecksumMode=ENABLED``, which
returns the full-object SHA-256 the store computed at upload, or our ``sha256`` user metadata where a store
keeps no checksum; for a Hugging Face repo, one tree listing: LFS sha256s, and git blob SHA-1s for regular
files, compared with the local file's). It answers "does this mirror hold exactly the corpus I have?" for a published corpus,
including ``manifest.json`` itself (the root of trust), and the copies by content (``by-sha256/``) of the
manifest and its files that readers pinned to it read, where the store keeps them.

The report is `marin_data.corpus.verify.VerifyReport`, so the CLI prints local and remote checks alike:
``missing``, ``truncated``/``oversized`` (sizes differ), ``modified`` (same size, other SHA-256), and
``unreadable`` for an object whose store reports no full-object SHA-256 (a multipart upload without our
metadata): its content cannot be vouched for without downloading it. A pin kept apart from its data
(the manifest's ``data``) has its shards compared with the data's store; given that store as URL, only them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from marin_data.fileio.atomic import sha256_file
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.names import select_subsets
from marin_data.corpus.verify import Problem, ProblemKind, VerifyReport
from marin_data.layout import MANIFEST
from marin_data.retry import DEFAULT_POLICY, RetryPolicy, retry_call
from marin_data.stores import open_store
from marin_data.stores.base import ObjectInfo, Store
from marin_data.stores.hub_ids import git_blob_sha1_file
from marin_data.transfer.apart import ApartStore
from marin_data.transfer.versions import content_path

__all__ = ["verify_remote"]


def verify_remote(
    root: str | os.PathLike,
    url: str,
    *,
    subsets: Iterable[str] | None = None,
    manifest_sha256: str | None = None,
    workers: int = 16,
    policy: RetryPolicy = DEFAULT_POLICY,
    **store_options,
) -> VerifyReport:
    """Check that the store at ``url`` holds the files the local corpus at ``root`` lists.

    Args:
        root: the local corpus whose manifest is the reference.
        url: the published copy (``s3://bucket/prefix``, ``hf://datasets/org/name``).
        subsets: names or globs of the subsets whose shards to check; None: every subset. The metadata
            files and ``manifest.json`` are always checked.
        manifest_sha256: the pinned sha256 of the local ``manifest.json``.
        workers: parallel ``head`` requests.
        policy: retry knobs.
        **store_options: for `open_store` (``endpoint_url``, ``anonymous``, ``requester_pays``...).

    Returns:
        A `VerifyReport` (``bytes_checked`` counts the bytes the store vouched for, not bytes read).

    Raises:
        InvalidManifestError: the local manifest cannot be trusted.
        RemoteError: the store cannot be reached or refuses us (after retries).
    """
    corpus = load_corpus(root, manifest_sha256=manifest_sha256)
    patterns = list(subsets or [])
    chosen = select_subsets(corpus.manifest.subsets, patterns)
    targets = [(s.path, s.bytes, s.sha256) for s in corpus.shards_of(chosen)]
    listed = [(p, r.bytes, r.sha256) for p, r in sorted(corpus.manifest.files.items())]
    listed.append((MANIFEST, *reversed(sha256_file(corpus.root / MANIFEST))))
    targets += listed
    # The copies by content that readers pinned to this version read (`marin_data.transfer.versions`),
    # checked where the store has them (a copy published before they existed has none).
    copies: dict[str, tuple[str, int, str]] = {content_path(sha, path): (path, size, sha)
                                               for path, size, sha in listed}
    store = open_store(url, max_connections=workers + 2, **store_options)
    data = corpus.manifest.data
    if data:  # a pin kept apart: its shards are compared with the data's store (`ApartStore`)
        shards = {s.path for s in corpus.shards}
        store = ApartStore(store, open_store(data, max_connections=workers + 2, **store_options), shards)
        if url.rstrip("/") == data.rstrip("/"):  # URL is the data's store: it holds the shards, not the pin
            targets, copies = [t for t in targets if t[0] in shards], {}

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify-remote") as pool:
        heads = list(pool.map(lambda path: retry_call(lambda: store.head(path), policy=policy,
                                                      what=store.describe(path)), [*(t[0] for t in targets), *copies]))
    present = [(name, head) for name, head in zip(copies, heads[len(targets):]) if head is not None]
    heads = [_by_git_blob_id(corpus.root, t[0], t[2], h) for t, h in zip(targets, heads[:len(targets)])]
    heads += [_by_git_blob_id(corpus.root, copies[name][0], copies[name][2], h) for name, h in present]
    targets += [(name, *copies[name][1:]) for name, _ in present]
    problems = [p for t, h in zip(targets, heads) if (p := _compare(store, *t, h)) is not None]
    return VerifyReport(
        root=str(corpus.root), manifest_sha256=corpus.manifest_sha256, subsets=tuple(chosen), deep=False,
        files_checked=len(targets), bytes_checked=sum(t[1] for t, h in zip(targets, heads) if h is not None),
        seconds=time.perf_counter() - t0, workers=workers, problems=tuple(sorted(problems, key=lambda p: p.path)),
        partial_files=(),
    )


def _by_git_blob_id(root: Path, path: str, sha256: str, have: ObjectInfo | None) -> ObjectInfo | None:
    """A Hugging Face repo vouches for a regular (non-LFS) file with its git blob SHA-1 only: when it matches
    the local file ``path``'s (wherever the store keeps it), and that file matches the manifest, the store holds
    the listed SHA-256 too. These are small metadata files (shards are LFS and carry their SHA-256), so
    hashing them locally costs nothing."""
    if have is None or have.sha256 is not None or have.git_sha1 is None:
        return have
    local = root / path
    same = local.is_file() and git_blob_sha1_file(local) == have.git_sha1 and sha256_file(local)[0] == sha256
    return replace(have, sha256=sha256 if same else f"(git blob {have.git_sha1})", sha256_source="git blob SHA-1")


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
                       "multipart or without marin's metadata): republish it", want, got)
    if have.sha256 != sha256:
        return Problem(path, ProblemKind.MODIFIED, f"{where} has sha256 {have.sha256[:12]}…, "
                       f"{sha256[:12]}… listed ({have.sha256_source})", want, got)
    return None
