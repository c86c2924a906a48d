"""The corpus description: ``manifest.json``, ``shards.parquet`` and ``SHA256SUMS``.

A corpus is a directory tree (docs/design.md, "The corpus format")::

    manifest.json     corpus-level facts; names the sha256 of every other metadata file (root of trust)
    shards.parquet    one row per shard: path, subset, bytes, sha256, docs, tokens, row_groups
    SHA256SUMS        ``sha256sum -c SHA256SUMS`` checks every shard and metadata file with coreutils alone
    tokenizer.json
    data/<subset>/part-00000.parquet

The chain of trust: the sha256 of ``manifest.json`` (printed by publish, shown in the datasheet, pinned
with ``--manifest-sha256``) vouches for ``shards.parquet`` through ``manifest["files"]``, which vouches for
every shard. The manifest is written last, so it never names a file that is not there. It also fixes
which Hugging Face repo of the corpus holds each subset (``manifest["repos"]``), so a download finds the
part repos through the pinned digest; where the corpus was published is recorded outside it
(`marin_data.corpus.mirrors`), so publishing never changes the digest.

Why the per-shard list lives in Parquet and not in the JSON: at 23T tokens there are ~100,000 shards; a
Parquet index reads in milliseconds with bounded memory and any tool opens it, while the manifest stays a
small, human-readable file.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from marin_data.atomic import SafeDir, atomic_path, atomic_write_bytes, sha256_file
from marin_data.errors import InvalidManifestError, ManifestHashMismatchError, UnknownSubsetError, UnsafePathError
from marin_data.layout import (BY_SHA256, COMMIT, LISTED, LOCK_NAME, MANIFEST, RECORD, SHARDS_INDEX, STAGING, SUMS,
                               TOKENIZER, UNLISTED)
from marin_data.parquet_io import open_parquet
from marin_data.raw.tokenizer import TokenizerInfo

__all__ = [
    "SCHEMA_VERSION",
    "MAX_FILES_PER_FOLDER",
    "MAX_FILES_PER_REPO",
    "SubsetInfo",
    "FileRecord",
    "ShardRecord",
    "Manifest",
    "Corpus",
    "safe_relpath",
    "check_subset_name",
    "select_subsets",
    "read_shard_index",
    "write_shard_index",
    "sums_text",
    "load_corpus",
    "commit_corpus",
    "finish_commit",
    "shards_fingerprint",
    "summarize_subsets",
    "assign_repos",
]

SCHEMA_VERSION = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# The Hub's limits (docs/design.md, "The corpus format"): about 100,000 files per repo, fewer than 10,000 per folder.
MAX_FILES_PER_FOLDER = 10_000
MAX_FILES_PER_REPO = 100_000


@dataclass(frozen=True)
class SubsetInfo:
    docs: int
    tokens: int
    bytes: int
    shards: int
    license: str = "unknown"  # SPDX id


@dataclass(frozen=True)
class FileRecord:
    """A metadata file of the corpus (shards.parquet, tokenizer.json, SHA256SUMS, README.md...)."""

    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardRecord:
    path: str  # relative POSIX path inside the corpus, e.g. data/pretrain/code/part-00000.parquet
    subset: str
    bytes: int
    sha256: str
    docs: int
    tokens: int
    row_groups: int


@dataclass
class Manifest:
    name: str
    version: str
    tokenizer: TokenizerInfo
    subsets: dict[str, SubsetInfo] = field(default_factory=dict)
    files: dict[str, FileRecord] = field(default_factory=dict)
    # subset -> the Hub repo that holds its shards: 1 the main repo org/name, n > 1 org/name-partN
    repos: dict[str, int] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> bytes:
        """Canonical bytes: sorted keys, no timestamps, so equal corpora have equal manifest digests."""
        doc = {
            "schema_version": self.schema_version,
            "name": self.name,
            "version": self.version,
            "tokenizer": asdict(self.tokenizer),
            "subsets": {k: asdict(v) for k, v in sorted(self.subsets.items())},
            "files": {k: asdict(v) for k, v in sorted(self.files.items())},
            "repos": dict(sorted(self.repos.items())),
        }
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, path: str = MANIFEST) -> Manifest:
        """Parse and validate manifest bytes; raise `InvalidManifestError` naming ``path`` on any defect."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise TypeError("top level is not an object")
            version = doc.get("schema_version")
            if version != SCHEMA_VERSION:
                raise InvalidManifestError(
                    f"unsupported schema_version {version!r} (this marin reads {SCHEMA_VERSION})",
                    path=path, expected=SCHEMA_VERSION, actual=version,
                )
            manifest = cls(
                name=str(doc["name"]),
                version=str(doc["version"]),
                tokenizer=TokenizerInfo(**doc["tokenizer"]),
                subsets={str(k): SubsetInfo(**v) for k, v in doc["subsets"].items()},
                files={safe_relpath(k, where=path): FileRecord(**v) for k, v in doc["files"].items()},
                repos={str(k): int(v) for k, v in doc.get("repos", {}).items()},
            )
        except InvalidManifestError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise InvalidManifestError(f"malformed manifest: {e!r}", path=path) from e
        for name in manifest.subsets:
            check_subset_name(name, path)
        for fname, rec in manifest.files.items():
            _check_digest(rec.sha256, f"{path} files[{fname}]")
        for name, part in manifest.repos.items():
            if name not in manifest.subsets or not 1 <= part <= len(manifest.subsets):  # each repo holds one
                raise InvalidManifestError(f"repos[{name!r}] = {part} names no subset or no repo", path=path)
        return manifest


@dataclass(frozen=True)
class Corpus:
    """A corpus on local disk: its root, parsed manifest, the manifest's own sha256, and the shard index."""

    root: Path
    manifest: Manifest
    manifest_sha256: str
    shards: tuple[ShardRecord, ...]

    def shards_of(self, subsets: Iterable[str]) -> list[ShardRecord]:
        wanted = set(subsets)
        return [s for s in self.shards if s.subset in wanted]


def safe_relpath(path: str, *, where: str = MANIFEST) -> str:
    """Return ``path`` if it is a clean relative POSIX path inside the corpus, else raise `UnsafePathError`.

    Absolute paths, ``..`` components, backslashes and empty components are refused, never followed:
    a tampered manifest must not make us read or write outside the corpus.
    """
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or re.match(r"^[A-Za-z]:", path)
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise UnsafePathError(f"unsafe path {path!r} in corpus description (absolute, '..' or malformed)",
                              path=where, actual=path)
    return path


def check_subset_name(name: str, where: str) -> None:
    """Subset names are relative paths (``pretrain/dclm``) that become folders under ``data/``: plain
    components of letters, digits, ``_``, ``.`` and ``-``, never ``.`` or ``..``."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*", name) or any(
        part in (".", "..") for part in name.split("/")
    ):
        raise InvalidManifestError(f"invalid subset name {name!r}", path=where, actual=name)


def _check_digest(digest: str, where: str) -> None:
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise InvalidManifestError(f"not a hex sha256: {digest!r}", path=where, actual=digest)


def select_subsets(available: Iterable[str], patterns: Sequence[str] | None, *,
                   what: str = "subset pattern") -> list[str]:
    """Resolve ``--subset`` patterns against subset names; all subsets when ``patterns`` is empty.

    A pattern matches a subset by exact name, by shell glob (``pretrain/*``), or as a parent path
    (``pretrain`` selects ``pretrain/dclm`` and ``pretrain/code``). A pattern that matches nothing is an
    error (`UnknownSubsetError`, naming the pattern as ``what``, and the known subsets), so a typo never
    silently selects less data.
    """
    names = sorted(available)
    if not patterns:
        return names
    chosen: set[str] = set()
    for pat in patterns:
        hits = [n for n in names if n == pat or fnmatch.fnmatchcase(n, pat) or n.startswith(pat.rstrip("/") + "/")]
        if not hits:
            raise UnknownSubsetError(
                f"{what} {pat!r} matches no subset; known subsets: {', '.join(names) or '(none)'}",
                expected=names, actual=pat,
            )
        chosen.update(hits)
    return sorted(chosen)


_INDEX_COLUMNS = ("path", "subset", "bytes", "sha256", "docs", "tokens", "row_groups")


def _index_schema():
    import pyarrow as pa

    return pa.schema([
        ("path", pa.string()), ("subset", pa.string()), ("bytes", pa.int64()), ("sha256", pa.string()),
        ("docs", pa.int64()), ("tokens", pa.int64()), ("row_groups", pa.int32()),
    ])


def write_shard_index(path: str | os.PathLike, shards: Iterable[ShardRecord], *,
                      root: str | os.PathLike | None = None) -> None:
    """Write ``shards.parquet`` atomically, rows sorted by (subset, path) so the bytes are deterministic."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_data.corpus.arrays import numbers, strings

    rows = sorted(shards, key=lambda s: (s.subset, s.path))
    schema = _index_schema()
    values = {f.name: [getattr(s, f.name) for s in rows] for f in schema}
    table = pa.table({f.name: strings(values[f.name]) if f.type == pa.string() else
                      numbers(values[f.name], f.type.to_pandas_dtype()) for f in schema}, schema=schema)
    with atomic_path(path, root=root) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_shard_index(source: str | os.PathLike | bytes, metadata: Iterable[str] = ()) -> list[ShardRecord]:
    """Read ``shards.parquet`` (a path, or its bytes as fetched); raise `InvalidManifestError` on a malformed
    index, an unsafe path, or one that contradicts itself (`_check_paths`; ``metadata`` are the manifest's
    other files, whose names a shard may not take either). Fetched bytes are decoded on the calling thread
    (`marin_data.parquet_io`)."""
    path = "shards.parquet (fetched)" if isinstance(source, bytes) else source
    try:
        with open_parquet(source) as pf:
            table = pf.read(columns=list(_INDEX_COLUMNS))  # no pyarrow.dataset import
        cols = {c: table.column(c).to_pylist() for c in _INDEX_COLUMNS}
    except (OSError, KeyError, ValueError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
        raise InvalidManifestError(f"unreadable shard index: {e}", path=str(path)) from e
    shards = [ShardRecord(*values) for values in zip(*(cols[c] for c in _INDEX_COLUMNS))]
    for s in shards:
        safe_relpath(s.path, where=str(path))
        check_subset_name(s.subset, str(path))
        _check_digest(s.sha256, f"{path} row {s.path}")
        if min(s.bytes, s.docs, s.tokens, s.row_groups) < 0:
            raise InvalidManifestError(f"negative size or count in row {s.path}", path=str(path), actual=s)
    _check_paths([s.path for s in shards], set(metadata), str(path))
    return shards


_RESERVED = {MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER, RECORD, LOCK_NAME, STAGING, BY_SHA256}


def _check_paths(paths: list[str], metadata: set[str], where: str) -> None:
    """Refuse an index that no directory can hold as it says: a path listed twice (or also as a metadata
    file), a path that is also another's folder (``X`` and ``X/inner.parquet``), a reserved name
    (`marin_data.layout`) or a partial file's name, which a download would write or remove."""
    seen: set[str] = set()
    for p in paths:
        if p in seen or p in metadata:
            raise InvalidManifestError(f"{p} is listed twice", path=where, actual=p)
        if p.split("/")[0] in _RESERVED or p.endswith(".part"):
            raise InvalidManifestError(f"{p} is a reserved name", path=where, actual=p)
        seen.add(p)
    files = seen | metadata
    for p in files:
        parents = p.split("/")[:-1]
        for i in range(1, len(parents) + 1):
            if "/".join(parents[:i]) in files:
                raise InvalidManifestError(f"{p} is listed inside the file {'/'.join(parents[:i])}",
                                           path=where, actual=p)


def sums_text(entries: Iterable[tuple[str, str]]) -> str:
    """``SHA256SUMS`` content from ``(path, sha256)`` pairs, sorted by path, in coreutils' text format."""
    return "".join(f"{digest}  {p}\n" for p, digest in sorted(entries))


def summarize_subsets(shards: Iterable[ShardRecord], licenses: dict[str, str]) -> dict[str, SubsetInfo]:
    """Per-subset totals computed from the shard rows (the manifest never holds a typed-in number)."""
    totals: dict[str, list[int]] = {}
    for s in shards:
        t = totals.setdefault(s.subset, [0, 0, 0, 0])
        t[0] += s.docs
        t[1] += s.tokens
        t[2] += s.bytes
        t[3] += 1
    return {
        name: SubsetInfo(docs=d, tokens=t, bytes=b, shards=n, license=licenses.get(name, "unknown"))
        for name, (d, t, b, n) in sorted(totals.items())
    }


def shards_fingerprint(shards: Iterable[ShardRecord], tokenizer_sha256: str) -> str:
    """A digest of exactly these shards' contents and the tokenizer.

    It covers the selected shards only, so a partial download and the full remote corpus give the same
    fingerprint for the same selection (docs/design.md, "The loader").
    """
    h = hashlib.sha256(tokenizer_sha256.encode())
    for s in sorted(shards, key=lambda s: s.path):
        h.update(f"\n{s.path}\t{s.sha256}\t{s.bytes}".encode())
    return h.hexdigest()


def load_corpus(root: str | os.PathLike, *, manifest_sha256: str | None = None) -> Corpus:
    """Open a local corpus: check the pinned manifest digest, parse it, and load the shard index.

    Args:
        root: the corpus directory.
        manifest_sha256: when given, the manifest's own sha256 must equal it (the root of trust).

    Raises:
        InvalidManifestError: missing or malformed manifest or index, unsafe paths, totals that disagree,
            or a shard index whose digest differs from the one the manifest names.
        ManifestHashMismatchError: the manifest differs from the pinned digest.
    """
    root = Path(root)
    try:  # a commit moving into place (`finish_commit`): its manifest, index and sums are the corpus's
        mpath, data = _read_first(root / COMMIT / MANIFEST, root / MANIFEST)
    except FileNotFoundError as e:
        raise InvalidManifestError("no manifest.json: not a marin corpus (or an unfinished one)",
                                   path=str(root / MANIFEST)) from e
    digest = hashlib.sha256(data).hexdigest()
    if manifest_sha256 is not None and digest != manifest_sha256.strip().lower():
        raise ManifestHashMismatchError(
            f"manifest sha256 is {digest}, but {manifest_sha256} was pinned: the mirror's copy differs",
            path=str(mpath), expected=manifest_sha256, actual=digest,
        )
    manifest = Manifest.from_json(data, str(mpath))
    index = manifest.files.get(SHARDS_INDEX)
    if index is None:
        raise InvalidManifestError(f"manifest does not list {SHARDS_INDEX}", path=str(mpath))
    try:
        ipath, index_bytes = _read_first(mpath.parent / SHARDS_INDEX, root / SHARDS_INDEX)
    except FileNotFoundError as e:
        raise InvalidManifestError(f"{SHARDS_INDEX} is missing", path=str(root / SHARDS_INDEX)) from e
    actual = hashlib.sha256(index_bytes).hexdigest(), len(index_bytes)
    if actual != (index.sha256, index.bytes):
        raise InvalidManifestError(
            f"{SHARDS_INDEX} does not match the manifest (sha256/size {actual[0][:12]}…/{actual[1]} "
            f"!= {index.sha256[:12]}…/{index.bytes})",
            path=str(ipath), expected=(index.sha256, index.bytes), actual=actual,
        )
    shards = read_shard_index(ipath, metadata=manifest.files)
    _check_totals(manifest, shards, str(mpath))
    return Corpus(root=root, manifest=manifest, manifest_sha256=digest, shards=tuple(shards))


def _check_totals(manifest: Manifest, shards: list[ShardRecord], where: str) -> None:
    computed = summarize_subsets(shards, {k: v.license for k, v in manifest.subsets.items()})
    if computed != manifest.subsets:
        bad = sorted(set(computed) ^ set(manifest.subsets)) or sorted(
            k for k in computed if computed[k] != manifest.subsets.get(k)
        )
        raise InvalidManifestError(f"subset totals disagree with {SHARDS_INDEX} for: {', '.join(bad)}",
                                   path=where)


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
    *, max_files_per_repo: int = MAX_FILES_PER_REPO,
) -> str:
    """Write the shard index, ``SHA256SUMS`` and finally ``manifest.json``; return the manifest's sha256.

    ``manifest.subsets`` is recomputed from ``shards``, keeping each subset's license (a subset being
    added may carry a placeholder `SubsetInfo` just for its license), and ``manifest.files`` is rebuilt
    from what is on disk: ``tokenizer.json``, the index, ``SHA256SUMS`` and ``extra_files`` (dataset card,
    Croissant, datasheets...), and ``manifest.repos`` is extended to new subsets (`assign_repos`, with room
    kept in the main repo for the generated documentation). Every shard must already be in place under its
    final name.
    """
    root = Path(root)
    journal = root / COMMIT
    shutil.rmtree(journal, ignore_errors=True)  # an unfinished journal: the corpus is still as before it
    shards = sorted(shards, key=lambda s: (s.subset, s.path))
    write_shard_index(journal / SHARDS_INDEX, shards, root=root)
    files: dict[str, FileRecord] = {}
    for rel in [TOKENIZER, SHARDS_INDEX, *extra_files]:
        rel = safe_relpath(rel)
        path = journal / rel if rel == SHARDS_INDEX else root / rel
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

    The index and ``SHA256SUMS`` move first and the manifest last, each rename persisted before the next, so
    a crash at any point leaves a journal that the next writer finishes; a writer calls this under the corpus
    lock before it reads the corpus, and `load_corpus` reads through a journal still moving in.
    """
    root = Path(root)
    journal = root / COMMIT
    if (journal / MANIFEST).exists():
        with SafeDir(root) as top, SafeDir(root, COMMIT, create=False) as moving:
            for name in (SHARDS_INDEX, SUMS, MANIFEST):
                if moving.lstat(name) is not None:
                    top.regular(name)
                    os.replace(name, name, src_dir_fd=moving.fd, dst_dir_fd=top.fd)
                    os.fsync(top.fd)
    shutil.rmtree(journal, ignore_errors=True)
    with contextlib.suppress(OSError):
        (root / STAGING).rmdir()  # only when no subset's staging is left


def _read_first(*paths: Path) -> tuple[Path, bytes]:
    """The first of ``paths`` that exists, and its bytes, read at once (a journal moving into place may take
    a file between a check and a read); FileNotFoundError when none does."""
    for path in paths:
        try:
            return path, path.read_bytes()
        except FileNotFoundError:
            continue
    raise FileNotFoundError(paths[-1])
