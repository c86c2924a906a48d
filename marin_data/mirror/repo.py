"""The mirror's view of ROOT: which directories are repos, what files they hold, and their content ids.

A repo ``org/name`` is the directory ``ROOT/org/name`` (a marin corpus or any folder). Its *snapshot* lists
every regular file under it with its git blob id (and, for LFS files, the content sha256), every folder
with a tree id, and a 40-hex *commit id*: the SHA-1 of the sorted ``(path, oid)`` list. The commit id is
therefore a pure function of the content — restart the server and it is the same; change a byte and it
changes — which is what a Hub client needs to cache by commit and to notice an update.

Cost control (hashing a 2 GiB shard per request would be absurd):

- content ids are cached per file by ``(size, mtime_ns, inode)`` and computed once (`ContentHashes`);
- for a marin corpus, shard sha256s come from ``shards.parquet`` (and metadata files' from
  ``manifest.json``) whenever the size on disk agrees, so serving a corpus hashes only its small files.
  A corrupt shard is then advertised with its *manifest* sha256, and clients reject the bytes: the mirror
  never vouches for bytes the corpus did not;
- a snapshot stays valid while no folder of the repo changed its mtime (every writer in this project
  replaces files by rename, which touches the folder); a file served is re-checked with ``fstat`` too, so an
  in-place edit is noticed on first use (`RepoStore.snapshot` is called again with ``refresh=True``).

Hidden paths (a folder or file name starting with ``.``, but a Levanter cache's ``.success`` and
``.stats.json``), our atomic-write temporaries (``*.<uuid8>.part``),
non-regular files, symlinked folders and symlinks whose target leaves ROOT are not part of a repo.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from marin_data.fileio.atomic import sha256_file
from marin_data.corpus.index import read_shard_index
from marin_data.corpus.manifest import Manifest
from marin_data.layout import MANIFEST, SHARDS_INDEX, STATS, SUCCESS
from marin_data.stores.hub_ids import LFS_SAMPLE_BYTES, git_blob_sha1, git_blob_sha1_file, is_lfs, lfs_pointer
from marin_data.transfer.versions import content_path

__all__ = ["FileEntry", "Snapshot", "ContentHashes", "RepoStore", "valid_repo_part", "split_repo_id", "file_stamp",
           "hidden_file"]

# A Levanter cache's own dot files: part of the data, served like any file (the Hub serves dot files too).
SERVED_DOT_FILES = frozenset({SUCCESS, STATS})


def hidden_file(name: str) -> bool:
    """A file name that is never part of a repo: our writers' and git's dot files (``.marin.lock``,
    ``.gitattributes``); a Levanter cache's ``.success`` and ``.stats.json`` are data."""
    return name.startswith(".") and name not in SERVED_DOT_FILES


log = logging.getLogger(__name__)

_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")  # the Hub's rule for org and repo names
_TEMP_FILE = re.compile(r"\.[0-9a-f]{8}\.part$")  # marin_data.fileio.atomic's temporaries


def valid_repo_part(part: str) -> bool:
    """An org or repo name the Hub accepts (no ``..``, no leading dot): it is a single, safe path component."""
    return bool(_REPO_PART.match(part)) and ".." not in part and not part.endswith(".git")


def split_repo_id(repo_id: str) -> tuple[str, str] | None:
    """``org/name`` -> ``(org, name)`` when both parts are valid, else None."""
    parts = repo_id.split("/")
    if len(parts) == 2 and all(valid_repo_part(p) for p in parts):
        return parts[0], parts[1]
    return None


@dataclass(frozen=True)
class FileEntry:
    """One file of a snapshot."""

    path: str
    size: int
    oid: str  # git blob id: of the content (regular file) or of the LFS pointer (LFS file)
    sha256: str | None  # content sha256 for LFS files, None for regular ones
    stamp: tuple[int, int, int]  # (size, mtime_ns, inode) when it was hashed: detects a changed file

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    def to_json(self) -> dict:
        """The Hub's tree / paths-info item for this file."""
        out: dict = {"type": "file", "oid": self.oid, "size": self.size, "path": self.path}
        if self.sha256 is not None:
            out["lfs"] = {"oid": self.sha256, "size": self.size,
                          "pointerSize": len(lfs_pointer(self.sha256, self.size))}
        return out


@dataclass(frozen=True)
class Snapshot:
    """A repo's content at one moment; immutable, so request threads can share it freely."""

    repo_id: str
    directory: Path  # the repo's real path
    commit: str
    files: Mapping[str, FileEntry]
    folders: Mapping[str, str]  # folder path ("" is the root) -> tree id
    children: Mapping[str, tuple[str, ...]]  # folder path -> sorted paths of its direct children
    last_modified: float  # newest mtime of any file (seconds since the epoch)
    folder_mtimes: tuple[tuple[str, int], ...]  # (real folder path, mtime_ns): the validity check

    def is_current(self) -> bool:
        """True while no folder of the repo gained, lost or renamed an entry since the scan."""
        try:
            return all(os.stat(p).st_mtime_ns == m for p, m in self.folder_mtimes)
        except OSError:
            return False

    def item(self, path: str) -> dict | None:
        """The tree item (file or folder) at ``path``, None when there is none."""
        if path in self.files:
            return self.files[path].to_json()
        if path in self.folders and path:
            return {"type": "directory", "oid": self.folders[path], "size": 0, "path": path}
        return None

    def listing(self, folder: str, *, recursive: bool) -> list[str]:
        """Paths below ``folder``, sorted: its children, or with ``recursive`` its whole subtree."""
        if not recursive:
            return list(self.children.get(folder, ()))
        out: list[str] = []
        stack = [folder]
        while stack:
            for child in self.children.get(stack.pop(), ()):
                out.append(child)
                if child in self.folders:
                    stack.append(child)
        return sorted(out)


class ContentHashes:
    """Content ids of files, computed once per file version and shared by every repo and request.

    The cache is keyed by the file's real path and validated by ``(size, mtime_ns, inode)``.
    """

    def __init__(self, workers: int | None = None):
        self._cache: dict[str, tuple[tuple[int, int, int], str, str | None]] = {}
        self._lock = threading.Lock()
        self._workers = workers or max(1, min(4, os.cpu_count() or 1))

    def ids(self, items: list[tuple[str, str, os.stat_result, str | None]]) -> list[tuple[str, str | None] | None]:
        """``(oid, sha256 or None)`` for each ``(real path, repo path, stat, known sha256)``; None for a file
        that cannot be read (it is then not served).

        Files not seen before are hashed on a small thread pool (hashlib releases the GIL).
        """
        out: list[tuple[str, str | None] | None] = []
        misses = []
        with self._lock:
            for i, (real, rel, st, known) in enumerate(items):
                hit = self._cache.get(real)
                if hit is not None and hit[0] == file_stamp(st):
                    out.append((hit[1], hit[2]))
                else:
                    out.append(None)
                    misses.append(i)
        if misses:
            total = sum(items[i][2].st_size for i in misses)
            if total > 256 << 20:
                log.info("hashing %d files (%.1f GiB) once; later requests use the cache", len(misses),
                         total / 2**30)
            with ThreadPoolExecutor(self._workers) as pool:
                computed = list(pool.map(lambda i: _file_ids(*items[i]), misses))
            with self._lock:
                for i, ids in zip(misses, computed):
                    real, _, st, _ = items[i]
                    if ids is not None:
                        self._cache[real] = (file_stamp(st), *ids)
                    out[i] = ids
        return out


def file_stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ino


def _file_ids(real: str, rel: str, st: os.stat_result, known_sha256: str | None) -> tuple[str, str | None] | None:
    try:
        with open(real, "rb") as f:
            sample = f.read(LFS_SAMPLE_BYTES)
        if not is_lfs(rel, st.st_size, sample):
            return git_blob_sha1_file(real), None
        sha256 = known_sha256 or sha256_file(real)[0]
    except OSError as e:
        log.warning("%s: unreadable, not served (%s)", real, e)
        return None
    return git_blob_sha1(lfs_pointer(sha256, st.st_size)), sha256


class RepoStore:
    """The repos under ROOT, with one cached snapshot each.

    Args:
        root: the directory whose ``org/name`` subdirectories are served.
        hashes: the content-id cache (shared between stores in tests).
    """

    def __init__(self, root: str | os.PathLike, hashes: ContentHashes | None = None):
        self.root = Path(root).resolve(strict=True)
        self.hashes = hashes or ContentHashes()
        self._snapshots: dict[str, Snapshot] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()

    def repo_dir(self, repo_id: str) -> Path | None:
        """The real directory of repo ``org/name``; None when it is not a valid id or not a folder in ROOT."""
        parts = split_repo_id(repo_id)
        if parts is None:
            return None
        path = (self.root / parts[0] / parts[1]).resolve()
        if not path.is_dir() or not path.is_relative_to(self.root):
            return None
        return path

    def repo_ids(self) -> list[str]:
        """Every repo id under ROOT, sorted."""
        ids = []
        for org in sorted(self.root.iterdir()):
            if org.is_dir() and valid_repo_part(org.name):
                ids.extend(f"{org.name}/{d.name}" for d in sorted(org.iterdir())
                           if valid_repo_part(d.name) and self.repo_dir(f"{org.name}/{d.name}"))
        return ids

    def skipped(self) -> list[tuple[str, str]]:
        """``(folder, why)`` for each folder of ROOT or ROOT/org that is not served, so a mirror that serves
        less than its owner expects says why."""
        out = []
        for org in sorted(self.root.iterdir()):
            if not org.is_dir():
                continue
            if not valid_repo_part(org.name):
                out.append((org.name, "not a valid org name"))
                continue
            for d in sorted(org.iterdir()):
                rel = f"{org.name}/{d.name}"
                if not valid_repo_part(d.name):
                    out.append((rel, "not a valid repo name") if d.is_dir() else (rel, "a file, not a repo folder"))
                elif d.is_symlink() and self.repo_dir(rel) is None:
                    out.append((rel, "a link that leads outside ROOT (refused: place or copy the repo in ROOT)"))
                elif not d.is_dir():
                    out.append((rel, "a file, not a repo folder"))
        return out

    def lock(self, repo_id: str) -> threading.RLock:
        """The (re-entrant) lock that serialises scans and commits of one repo."""
        with self._guard:
            return self._locks.setdefault(repo_id, threading.RLock())

    def snapshot(self, repo_id: str, *, refresh: bool = False) -> Snapshot | None:
        """The repo's current snapshot (rescanned when stale or when ``refresh``); None when no such repo."""
        directory = self.repo_dir(repo_id)
        if directory is None:
            return None
        snap = self._snapshots.get(repo_id)
        if snap is not None and not refresh and snap.directory == directory and snap.is_current():
            return snap
        with self.lock(repo_id):
            snap = self._snapshots.get(repo_id)
            if refresh or snap is None or snap.directory != directory or not snap.is_current():
                snap = self._scan(repo_id, directory)
                self._snapshots[repo_id] = snap
            return snap

    def invalidate(self, repo_id: str) -> None:
        self._snapshots.pop(repo_id, None)

    def _scan(self, repo_id: str, directory: Path) -> Snapshot:
        known = _marin_hashes(directory)
        items: list[tuple[str, str, os.stat_result, str | None]] = []
        folder_mtimes: list[tuple[str, int]] = []
        folders = {""}
        for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
            folder_mtimes.append((dirpath, os.stat(dirpath).st_mtime_ns))
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not os.path.islink(
                os.path.join(dirpath, d)))
            rel_dir = Path(dirpath).relative_to(directory).as_posix()
            rel_dir = "" if rel_dir == "." else rel_dir
            folders.update(f"{rel_dir}/{d}".lstrip("/") for d in dirnames)
            for name in filenames:
                if hidden_file(name) or _TEMP_FILE.search(name):
                    continue
                real = os.path.realpath(os.path.join(dirpath, name))
                if not Path(real).is_relative_to(self.root):
                    continue  # a symlink leaving ROOT is never served
                try:
                    st = os.stat(real)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    rel = f"{rel_dir}/{name}".lstrip("/")
                    hint = known.get(rel)
                    items.append((real, rel, st, hint[0] if hint and hint[1] == st.st_size else None))
        ids = self.hashes.ids(items)
        files = {rel: FileEntry(rel, st.st_size, i[0], i[1], file_stamp(st))
                 for (_, rel, st, _), i in zip(items, ids) if i is not None}
        children = _children(files, folders)
        return Snapshot(
            repo_id=repo_id,
            directory=directory,
            commit=hashlib.sha1("".join(f"{p}\0{files[p].oid}\n" for p in sorted(files)).encode()).hexdigest(),
            files=files,
            folders=_tree_ids(files, folders, children),
            children=children,
            last_modified=max((st.st_mtime for _, _, st, _ in items), default=0.0),
            folder_mtimes=tuple(folder_mtimes),
        )


def _children(files: Iterable[str], folders: Iterable[str]) -> dict[str, tuple[str, ...]]:
    kids: dict[str, list[str]] = {}
    for path in [*files, *(f for f in folders if f)]:
        kids.setdefault(path.rpartition("/")[0], []).append(path)
    return {k: tuple(sorted(v)) for k, v in kids.items()}


def _tree_ids(files: Mapping[str, FileEntry], folders: set[str], children: Mapping[str, tuple[str, ...]]
              ) -> dict[str, str]:
    """A git-like tree id per folder (SHA-1 of its children's names and ids), deepest folders first."""
    ids: dict[str, str] = {}
    for folder in sorted(folders, key=lambda f: -f.count("/") - (f != "")):
        lines = "".join(f"{c.rpartition('/')[2]}\0{files[c].oid if c in files else ids[c]}\n"
                        for c in children.get(folder, ()))
        ids[folder] = hashlib.sha1(lines.encode()).hexdigest()
    return ids


def _marin_hashes(directory: Path) -> dict[str, tuple[str, int]]:
    """``path -> (sha256, size)`` of the shards a marin corpus's shard index vouches for, if it is one (the
    metadata files are small: they are hashed).

    The index is the one the manifest lists, read by content (``by-sha256/``, `marin_data.transfer.versions`)
    where the repo keeps it so, and used only when its sha256 is the listed one: a folder caught between two
    versions never lends one version's hashes to the other's files. Best effort: a folder that is not a
    (valid) corpus simply gets every file hashed.
    """
    try:
        manifest = Manifest.from_json((directory / MANIFEST).read_bytes())
        out: dict[str, tuple[str, int]] = {}
        rec = manifest.files.get(SHARDS_INDEX)
        if rec is not None:
            for candidate in (content_path(rec.sha256, SHARDS_INDEX), SHARDS_INDEX):
                path = directory / candidate
                if path.is_file() and sha256_file(path) == (rec.sha256, rec.bytes):
                    out.update({s.path: (s.sha256, s.bytes) for s in read_shard_index(path)})
                    break
        return out
    except (OSError, ValueError) as e:
        if (directory / MANIFEST).exists():
            log.warning("%s: not using its manifest's hashes (%s); hashing its files instead", directory, e)
        return {}
