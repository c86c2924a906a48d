"""Committing a corpus: the shard index, ``SHA256SUMS`` and, last, ``manifest.json``, moved in as one.

`commit_corpus` writes the three into a journal (`marin_data.layout.COMMIT`) and `finish_commit` moves it
into place, the manifest last, so a crash at any point leaves either the corpus as before or a journal the
next writer finishes (docs/security.md). `assign_repos` decides, at commit time, which Hugging Face repo
holds each subset within the Hub's file-count limits, so the split is part of the pinned manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from marin_data.fileio.atomic import SafeDir, atomic_write_bytes, sha256_file
from marin_data.corpus.index import write_shard_index
from marin_data.corpus.manifest import Manifest, summarize_subsets
from marin_data.corpus.names import safe_relpath
from marin_data.corpus.records import FileRecord, ShardRecord
from marin_data.layout import COMMIT, LISTED, MANIFEST, SHARDS_INDEX, STAGING, SUMS, TOKENIZER, UNLISTED

__all__ = [
    "MAX_FILES_PER_FOLDER",
    "MAX_FILES_PER_REPO",
    "assign_repos",
    "commit_corpus",
    "finish_commit",
    "sums_text",
]

# The Hub's limits (docs/design.md, "The corpus format"): about 100,000 files per repo, fewer than 10,000 per folder.
MAX_FILES_PER_FOLDER = 10_000
MAX_FILES_PER_REPO = 100_000


def sums_text(entries: Iterable[tuple[str, str]]) -> str:
    """``SHA256SUMS`` content from ``(path, sha256)`` pairs, sorted by path, in coreutils' text format."""
    return "".join(f"{digest}  {p}\n" for p, digest in sorted(entries))


def assign_repos(shards: Iterable[ShardRecord], *, meta_files: int, previous: dict[str, int],
                 max_files_per_repo: int = MAX_FILES_PER_REPO) -> dict[str, int]:
    """Which Hub repo holds each subset: the main repo (1, which also holds ``meta_files`` metadata files)
    first, then part repos (2, 3...: each also holds its own card), packed first-fit in name order.

    A subset keeps the repo ``previous`` gave it, so adding a subset never moves published shards. A subset
    too big for any repo still gets one of its own; publishing to the Hub refuses it with the numbers.
    """
    counts: dict[str, int] = {}
    for s in shards:
        counts[s.subset] = counts.get(s.subset, 0) + 1
    used = {1: meta_files}
    repos = {name: previous[name] for name in sorted(counts) if previous.get(name, 0) >= 1}
    for name, part in repos.items():
        used[part] = used.get(part, 1) + counts[name]
    for name in sorted(set(counts) - set(repos)):
        part = next((p for p in sorted(used) if used[p] + counts[name] <= max_files_per_repo), max(used) + 1)
        used[part] = used.get(part, 1) + counts[name]
        repos[name] = part
    return dict(sorted(repos.items()))


def commit_corpus(
    root: str | os.PathLike, manifest: Manifest, shards: Sequence[ShardRecord], extra_files: Sequence[str] = (),
    *, max_files_per_repo: int = MAX_FILES_PER_REPO, staged: Mapping[str, bytes] | None = None,
) -> str:
    """Write the shard index, ``SHA256SUMS`` and finally ``manifest.json``; return the manifest's sha256.

    ``manifest.subsets`` is recomputed from ``shards``, keeping each subset's license (a subset being
    added may carry a placeholder `SubsetInfo` just for its license), and ``manifest.files`` is rebuilt
    from what is on disk: ``tokenizer.json``, the index, ``SHA256SUMS`` and ``extra_files`` (dataset card,
    Croissant, datasheets...), and ``manifest.repos`` is extended to new subsets (`assign_repos`, with room
    kept in the main repo for the generated documentation). Every shard must already be in place under its
    final name. ``staged`` files (name at the root -> bytes) go into the journal and move in with the commit,
    before the manifest: a crash leaves none of them at the root without a committed manifest listing them.
    """
    root = Path(root)
    journal = root / COMMIT
    shutil.rmtree(journal, ignore_errors=True)  # an unfinished journal: the corpus is still as before it
    staged = staged or {}
    for name, data in staged.items():
        if "/" in safe_relpath(name) or name in (SHARDS_INDEX, SUMS, MANIFEST):
            raise ValueError(f"{name!r}: a commit stages files at the root only, and none it writes itself")
        atomic_write_bytes(journal / name, data, root=root)
    shards = sorted(shards, key=lambda s: (s.subset, s.path))
    write_shard_index(journal / SHARDS_INDEX, shards, root=root)
    files: dict[str, FileRecord] = {}
    for rel in dict.fromkeys([TOKENIZER, SHARDS_INDEX, *extra_files, *staged]):
        rel = safe_relpath(rel)
        path = journal / rel if rel == SHARDS_INDEX or rel in staged else root / rel
        if path.exists():
            files[rel] = FileRecord(*reversed(sha256_file(path)))
    sums = sums_text([(s.path, s.sha256) for s in shards] + [(p, r.sha256) for p, r in files.items()])
    atomic_write_bytes(journal / SUMS, sums.encode(), root=root)
    files[SUMS] = FileRecord(*reversed(sha256_file(journal / SUMS)))
    licenses = {k: v.license for k, v in manifest.subsets.items()}
    meta = len({MANIFEST, *files, *LISTED, *UNLISTED})
    repos = assign_repos(shards, meta_files=meta, previous=manifest.repos, max_files_per_repo=max_files_per_repo)
    final = replace(manifest, subsets=summarize_subsets(shards, licenses), files=files, repos=repos)
    data = final.to_json()
    atomic_write_bytes(journal / MANIFEST, data, root=root)  # the commit point: the journal is complete
    finish_commit(root)
    return hashlib.sha256(data).hexdigest()


def finish_commit(root: str | os.PathLike) -> None:
    """Move a complete commit journal (`COMMIT`, its manifest written) into place, or discard one a crash
    left incomplete (the corpus is then still as before it).

    Staged files, the index and ``SHA256SUMS`` move first and the manifest last, each rename persisted before
    the next, so a crash at any point leaves a journal that the next writer finishes; a writer calls this
    under the corpus lock before it reads the corpus, and `load_corpus` reads through a journal still moving
    in.
    """
    root = Path(root)
    journal = root / COMMIT
    if (journal / MANIFEST).exists():
        with SafeDir(root) as top, SafeDir(root, COMMIT, create=False) as moving:
            staged = sorted(n for n in os.listdir(moving.fd) if n not in (SHARDS_INDEX, SUMS, MANIFEST)
                            and not n.endswith(".part"))  # `commit_corpus`'s ``staged`` files
            for name in (*staged, SHARDS_INDEX, SUMS, MANIFEST):
                if moving.lstat(name) is not None:
                    top.regular(name)
                    os.replace(name, name, src_dir_fd=moving.fd, dst_dir_fd=top.fd)
                    os.fsync(top.fd)
    shutil.rmtree(journal, ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / STAGING).rmdir()  # only when no subset's staging is left
