"""Publish a corpus to Hugging Face dataset repos (the Hub, or any Hub-compatible endpoint such as
``marin-data serve --writable``) through ``HfApi``.

What it does, and why:

- **Layout**: files keep their corpus paths, so a repo *is* the corpus layout (docs/design.md) and
  ``snapshot_download``, ``datasets`` and ``marin-data download`` all see the same tree.
- **Split across repos** as the manifest says (``Manifest.repos``, decided when the corpus was committed so
  that the pinned digest vouches for it): subset by subset into the main repo ``org/name`` (which also holds
  the manifest, the shard index, the card, the tokenizer, the datasheet) and ``org/name-part2``,
  ``org/name-part3``... A download finds each subset's repo through the manifest. The Hub's file-count
  limits (docs/design.md: ~100,000 files per repo, fewer than 10,000 per folder) are checked before
  anything is sent; they are parameters so tests can use tiny ones.
- **Batched commits** of at most ``commit_files`` files / ``commit_bytes`` bytes: one commit per file would
  flood the Hub, one commit for 100,000 files would be lost whole by one failure. Data files go first,
  the part repos before the main one, with the content copies of the metadata files and of the manifest
  (``by-sha256/<sha256>/<name>``, `marin_data.transfer.versions`) and the kept files of the version the
  repo served before; then ``manifest.json`` and the plain metadata files (index, ``SHA256SUMS``, card...)
  together in the very last commit. Each commit is atomic, so a reader of any commit (the Hub's own
  viewer, ``snapshot_download``) sees one whole version, and a reader pinned to an older manifest finds
  it and its files by content.
- **Resumable**: each repo is listed once (``list_repo_tree``); a file already there with the same content
  (LFS sha256 and size, or git blob SHA-1 for a regular file) is skipped without being read. A file about to
  be sent is hashed first and refused if it no longer matches the manifest.
- **Mirrors recorded last** (as the S3 publish does): the manifest is published byte for byte, and the repos
  go into the local ``mirrors.json`` only once their listings match the manifest; a datasheet that states
  another digest is refused before anything is sent.
- **Xet**: ``huggingface_hub`` uploads through Xet whenever ``hf_xet`` is installed, and does not fall back.
  An endpoint that has no Xet token endpoint (``marin-data serve``, most self-hosted mirrors) gets the Git
  LFS protocol instead: ``HF_HUB_DISABLE_XET`` is switched on for the duration of the publish.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from marin_data.fileio.atomic import sha256_file
from marin_data.corpus.commit import finish_commit
from marin_data.corpus.manifest import Corpus, load_corpus
from marin_data.errors import ObjectTooLargeError, RemoteError, ShardChecksumError
from marin_data.layout import CARD, MANIFEST, UNLISTED
from marin_data.fileio.lock import corpus_lock
from marin_data.retry import DEFAULT_POLICY
from marin_data.stores import open_store
from marin_data.stores.hub_ids import (
    MAX_FILES_PER_FOLDER,
    MAX_FILES_PER_REPO,
    git_blob_sha1,
    git_blob_sha1_file,
    parse_hf_url,
)
from marin_data.transfer.apart import refuse_publish
from marin_data.transfer.publish_s3 import PublishReport, check_datasheet, check_published
from marin_data.transfer.versions import content_path, keep_published
from marin_data.ui import human_bytes, plural, progress as progress_bar

__all__ = ["HfPublishReport", "RepoPlan", "commit_files", "plan_repos", "publish_hf"]


@dataclass(frozen=True)
class HfPublishReport(PublishReport):
    repos: tuple[str, ...] = ()  # hf:// URLs, the main repo first
    commits: int = 0


@dataclass(frozen=True)
class _File:
    path: str  # in the repo
    bytes: int
    sha256: str | None  # None for a file that is not in the manifest (a part repo's generated card)
    content: bytes | None = None  # generated and kept files are uploaded from memory
    src: str | None = None  # the local file, relative to the corpus, when not ``path`` (a content name's)
    last: bool = False  # in the last commit, with the manifest

    @property
    def local(self) -> str:
        return self.src or self.path


@dataclass(frozen=True)
class RepoPlan:
    """One repo of a publish: its id, the subsets whose shards it holds, and every file it gets."""

    repo_id: str
    subsets: tuple[str, ...]
    files: tuple[_File, ...]


def plan_repos(corpus: Corpus, repo_id: str, *, max_files_per_repo: int = MAX_FILES_PER_REPO,
               max_files_per_folder: int = MAX_FILES_PER_FOLDER) -> list[RepoPlan]:
    """The repos of the corpus as its manifest assigns subsets to them, the main repo ``repo_id`` first.

    Raises:
        ObjectTooLargeError: a repo or a folder would hold more files than the limits allow.
    """
    meta = [_File(p, r.bytes, r.sha256, last=True) for p, r in sorted(corpus.manifest.files.items())]
    unlisted = [*UNLISTED, *([CARD] if CARD not in corpus.manifest.files else [])]  # the card, even when unlisted
    meta += [_File(p, (corpus.root / p).stat().st_size, None, last=True) for p in unlisted
             if (corpus.root / p).is_file()]
    manifest = _File(MANIFEST, (corpus.root / MANIFEST).stat().st_size, corpus.manifest_sha256, last=True)
    copies = [_File(content_path(f.sha256, f.path), f.bytes, f.sha256, src=f.path)
              for f in [*meta, manifest] if f.sha256 is not None]
    meta += [manifest, *copies]
    by_subset: dict[str, list[_File]] = {}
    for s in corpus.shards:
        by_subset.setdefault(s.subset, []).append(_File(s.path, s.bytes, s.sha256))
    _check_folders([*meta, *(f for fs in by_subset.values() for f in fs)], max_files_per_folder)

    parts = {subset: corpus.manifest.repos.get(subset, 1) for subset in by_subset}
    groups: list[list[str]] = [[] for _ in range(max(parts.values(), default=1))]
    for subset in sorted(by_subset):
        groups[parts[subset] - 1].append(subset)
    plans = []
    for i, subsets in enumerate(groups):
        rid = repo_id if i == 0 else f"{repo_id}-part{i + 1}"
        files = [f for s in subsets for f in by_subset[s]]
        if i == 0:
            files += meta
        else:
            card = _part_card(corpus, repo_id, subsets, i + 1).encode()
            files.append(_File(CARD, len(card), None, card))
        if len(files) > max_files_per_repo:
            raise ObjectTooLargeError(
                f"repo {rid} would hold {len(files)} files (subsets {', '.join(subsets)}), more than "
                f"{max_files_per_repo}: split its subsets into child subsets", path=rid,
                expected=max_files_per_repo, actual=len(files))
        plans.append(RepoPlan(rid, tuple(subsets), tuple(files)))
    return plans


def _check_folders(files: Sequence[_File], limit: int) -> None:
    counts: dict[str, int] = {}
    for f in files:
        folder = f.path.rpartition("/")[0]
        counts[folder] = counts.get(folder, 0) + 1
    full = {k: v for k, v in counts.items() if v >= limit}
    if full:
        folder, n = next(iter(full.items()))
        raise ObjectTooLargeError(f"folder {folder or '/'} would hold {n} files; the Hub allows fewer than {limit} "
                                  "per folder: split the subset", path=folder, expected=limit, actual=n)


def _part_card(corpus: Corpus, main: str, subsets: Sequence[str], n: int) -> str:
    return (f"---\npretty_name: {corpus.manifest.name} (part {n})\n---\n# {corpus.manifest.name}, part {n}\n\n"
            f"Shards of the subsets {', '.join(subsets)} of the corpus whose manifest, dataset card and shard "
            f"index live in [`{main}`](../{main}). Download with `marin-data download hf://datasets/{main} "
            f"--subset ...`: it finds this repo through the manifest's mirrors.\n")


def publish_hf(
    root: str | os.PathLike,
    *,
    to: str,
    endpoint: str | None = None,
    token: str | None = None,
    max_files_per_repo: int = MAX_FILES_PER_REPO,
    max_files_per_folder: int = MAX_FILES_PER_FOLDER,
    commit_files: int = 100,
    commit_bytes: int = 50 << 30,
    workers: int = 8,
    private: bool = False,
    progress: bool | None = None,
) -> HfPublishReport:
    """Publish the corpus at ``root`` to the dataset repo(s) named by ``to``, check them, and record them as
    mirrors.

    Args:
        root: a local corpus directory.
        to: ``hf://datasets/org/name`` (the main repo; part repos get ``-part2``... suffixes).
        endpoint: the Hub endpoint (a mirror's URL); default ``HF_ENDPOINT`` or huggingface.co.
        token: a write token; default the one ``huggingface_hub`` finds (``HF_TOKEN``, ``hf auth login``).
        max_files_per_repo: refuse a repo with more files than this.
        max_files_per_folder: refuse a folder with this many files or more.
        commit_files: most files in one commit.
        commit_bytes: most bytes in one commit.
        workers: files uploaded in parallel within a commit.
        private: create new repos private.
        progress: show a progress bar; None shows it when stderr is a terminal.

    Raises:
        ObjectTooLargeError: a subset cannot fit the limits; nothing was uploaded.
        ShardChecksumError: a local file no longer matches the manifest; it was not uploaded, nor the manifest.
        StaleDatasheetError: the datasheet states another manifest digest; nothing was uploaded.
        TransferFailedError: the repos do not hold what was sent; not recorded as mirrors.
        RemoteError: a malformed URL, or the endpoint refused a request (credentials, permissions).
    """
    from huggingface_hub import HfApi

    try:
        url = parse_hf_url(to)
    except ValueError as e:
        raise RemoteError(str(e), path=to) from e
    if url.revision not in (None, "main"):
        raise RemoteError("publish writes the main branch only", path=to)
    if commit_files < 1 or commit_bytes < 1:
        raise ValueError("commit_files and commit_bytes must be >= 1")
    api = HfApi(endpoint=endpoint, token=token)
    corpus = load_corpus(root)
    refuse_publish(corpus)  # a pin kept apart from its data: its shards are not here
    check_datasheet(corpus.root, corpus.manifest_sha256)
    plans = plan_repos(corpus, url.repo_id, max_files_per_repo=max_files_per_repo,
                       max_files_per_folder=max_files_per_folder)
    t0 = time.perf_counter()
    totals = _Totals()
    with corpus_lock(corpus.root):
        finish_commit(corpus.root)  # a commit a kill left moving in: its files, not a mix, are uploaded
        corpus = load_corpus(corpus.root, manifest_sha256=corpus.manifest_sha256)  # unchanged since planned
        served = open_store(str(url), endpoint=endpoint, token=token)
        kept = [_File(k.path, len(k.data), k.sha256, k.data)
                for k in keep_published(served, corpus.manifest_sha256, corpus.shards, DEFAULT_POLICY)]
        plans[0] = replace(plans[0], files=(*kept, *plans[0].files))
        bar = progress_bar(sum(f.bytes for p in plans for f in p.files), "publish", unit="B", unit_scale=True,
                           disable=None if progress is None else not progress)
        try:
            with _hub_bars(sys.stderr.isatty() if progress is None else progress):
                for plan in [*plans[1:], plans[0]]:  # the main repo, with the manifest, last
                    with _hub_errors(plan.repo_id):
                        api.create_repo(plan.repo_id, repo_type="dataset", exist_ok=True, private=private)
                        _publish_repo(api, plan, corpus.root, totals, bar, commit_files=commit_files,
                                      commit_bytes=commit_bytes, workers=workers, main=plan is plans[0])
        finally:
            bar.close()
        extra = {"endpoint": endpoint.rstrip("/")} if endpoint else {}
        check_published(corpus.root, str(url), [{"url": f"hf://datasets/{p.repo_id}", "subsets": list(p.subsets),
                                                 **extra} for p in plans], endpoint=endpoint, token=token)
    return HfPublishReport(
        url=str(url), manifest_sha256=corpus.manifest_sha256, uploaded=tuple(totals.uploaded),
        skipped=tuple(totals.skipped), bytes_uploaded=totals.bytes, seconds=time.perf_counter() - t0,
        repos=tuple(f"hf://datasets/{p.repo_id}" for p in plans), commits=totals.commits)


@dataclass
class _Totals:
    uploaded: list[str] = field(default_factory=list)  # corpus paths; a part repo's card as "org/name-partN:README.md"
    skipped: list[str] = field(default_factory=list)
    commits: int = 0
    bytes: int = 0


def _publish_repo(api, plan: RepoPlan, root: Path, totals: _Totals, bar, *, commit_files: int, commit_bytes: int,
                  workers: int, main: bool) -> None:
    """Send what ``plan.repo_id`` lacks, in batched commits, ``manifest.json`` and the plain metadata last."""
    remote = _remote_ids(api, plan.repo_id)
    label = (lambda p: p) if main else (lambda p: f"{plan.repo_id}:{p}" if p == CARD else p)
    todo = []
    for f in plan.files:
        if _same(root, f, remote.get(f.path)):
            totals.skipped.append(label(f.path))
            bar.update(f.bytes)
        else:
            todo.append(f)
    data = [f for f in todo if not f.last]
    last = [f for f in todo if f.last]
    if last and not any(f.path == MANIFEST for f in last):  # the plain copies lag the published manifest
        last.append(next(f for f in plan.files if f.path == MANIFEST))
    with _lfs_unless_xet(api, plan.repo_id):
        for batch in [*_batches(data, commit_files, commit_bytes), sorted(last, key=lambda f: f.path == MANIFEST)]:
            if batch:
                _commit(api, plan.repo_id, root, batch, workers)
                totals.commits += 1
                totals.uploaded.extend(label(f.path) for f in batch)
                totals.bytes += sum(f.bytes for f in batch)
                bar.update(sum(f.bytes for f in batch))


def _remote_ids(api, repo_id: str) -> dict[str, tuple[int, str | None, str]]:
    """``path -> (size, lfs sha256 or None, git blob id)`` of every file in the repo's main branch."""
    from huggingface_hub.hf_api import RepoFile

    return {e.path: (e.size, e.lfs.sha256 if e.lfs else None, e.blob_id)
            for e in api.list_repo_tree(repo_id, repo_type="dataset", recursive=True) if isinstance(e, RepoFile)}


def _same(root: Path, f: _File, remote: tuple[int, str | None, str] | None) -> bool:
    """Whether the repo already holds ``f``'s content, judged without reading shards."""
    if remote is None or remote[0] != f.bytes:
        return False
    size, lfs_sha256, blob_id = remote
    if lfs_sha256 is not None:
        return f.sha256 is not None and lfs_sha256 == f.sha256
    if f.content is not None:
        return git_blob_sha1(f.content) == blob_id
    return git_blob_sha1_file(root / f.local) == blob_id  # a regular (small) file


def _batches(files: Sequence[_File], max_files: int, max_bytes: int) -> Iterator[list[_File]]:
    batch: list[_File] = []
    size = 0
    for f in files:
        if batch and (len(batch) >= max_files or size + f.bytes > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(f)
        size += f.bytes
    if batch:
        yield batch


def _commit(api, repo_id: str, root: Path, batch: Sequence[_File], workers: int) -> None:
    """One commit of ``batch``; every listed file is hashed first and refused if it left the manifest."""
    from huggingface_hub import CommitOperationAdd

    ops = []
    for f in batch:
        if f.content is not None:
            ops.append(CommitOperationAdd(f.path, f.content))
            continue
        digest, size = sha256_file(root / f.local)
        if f.sha256 is not None and (digest, size) != (f.sha256, f.bytes):
            raise ShardChecksumError(
                f"the local file no longer matches the manifest (sha256/size {digest[:12]}…/{size} != "
                f"{f.sha256[:12]}…/{f.bytes}); not uploaded, and neither is the manifest", path=f.path,
                expected=f.sha256, actual=digest)
        op = CommitOperationAdd(f.path, str(root / f.local))
        op.upload_info.sha256 = bytes.fromhex(digest)  # hashed once, here
        ops.append(op)
    total = sum(f.bytes for f in batch)
    api.create_commit(repo_id, ops, repo_type="dataset", num_threads=workers,
                      commit_message=f"marin-data publish: {plural(len(batch), 'file')} ({human_bytes(total)})")


def commit_files(url: str, folder: Path, names: Sequence[str], *, message: str, endpoint: str | None = None,
                 token: str | None = None) -> None:
    """The files ``names`` of ``folder`` as one commit of the dataset repo ``url`` (created if needed): all of
    them or none (``adopt --pin-to hf://``).

    Raises:
        RemoteError: a malformed URL, or the endpoint refused a request.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    try:
        repo = parse_hf_url(url).repo_id
    except ValueError as e:
        raise RemoteError(str(e), path=url) from e
    api = HfApi(endpoint=endpoint, token=token)
    with _hub_errors(repo), _hub_bars(False):
        api.create_repo(repo, repo_type="dataset", exist_ok=True)
        with _lfs_unless_xet(api, repo):
            api.create_commit(repo, [CommitOperationAdd(n, str(folder / n)) for n in names], repo_type="dataset",
                              commit_message=message)


@contextlib.contextmanager
def _lfs_unless_xet(api, repo_id: str) -> Iterator[None]:
    """Upload over Git LFS when the endpoint hands out no Xet write token (see the module docstring)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session

    before = constants.HF_HUB_DISABLE_XET
    if not before:
        url = f"{api.endpoint}/api/datasets/{repo_id}/xet-write-token/main"
        r = get_session().get(url, headers=build_hf_headers(token=api.token), timeout=30)
        constants.HF_HUB_DISABLE_XET = r.status_code != 200
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = before


@contextlib.contextmanager
def _hub_bars(show: bool) -> Iterator[None]:
    """huggingface_hub's per-file upload bars follow marin's own rule: shown only on a terminal."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hide = not show and not are_progress_bars_disabled()
    if hide:
        disable_progress_bars()
    try:
        yield
    finally:
        if hide:
            enable_progress_bars()


@contextlib.contextmanager
def _hub_errors(repo_id: str) -> Iterator[None]:
    """Turn the client's HTTP errors into `RemoteError` naming the repo (the CLI maps it to an exit code)."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        raise RemoteError(str(e).splitlines()[0] or repr(e), path=f"hf://datasets/{repo_id}", status=status) from e
