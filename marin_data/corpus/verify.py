"""``verify``: prove that a local corpus holds exactly the bytes its manifest vouches for.

`verify_corpus` loads the corpus (`load_corpus` checks the manifest and shard index: a broken link is an
invalid manifest, exit 2), re-hashes every listed file on a thread pool (or Ray, ``engine="ray"``) and walks
the tree for files nobody listed; any finding (`ProblemKind`: missing, truncated, oversized, modified,
unreadable, unlisted, bad_format (a shard's schema, from its footer); with ``deep=True`` also its encodings,
wrong_tokenizer, count_mismatch) fails it (exit 1). A partial download is checked for the subsets its record
names (`marin_data.corpus.record`). The lock file and staging folder are skipped, and so are other tools'
bookkeeping (`marin_data.corpus.foreign`: a ``hf download --local-dir`` copy's ``.cache/huggingface/``, Marin's
executor's ``.executor_info`` and ``.executor_status``, named in the report as ``ignored``); leftover ``*.part``
files are reported apart and do not fail it. What
counts as a finding, and why; the speed; the deep check: docs/data.md.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from marin_data.fileio.atomic import sha256_file
from marin_data.corpus.manifest import MARIN, Corpus, load_corpus
from marin_data.corpus.names import select_subsets
from marin_data.corpus.record import read_download_record
from marin_data.corpus.foreign import FOREIGN_FOLDERS, foreign
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.shard import check_schema, count_tokens, inspect_shard
from marin_data.engines import Engine, make_engine
from marin_data.engines.local import default_workers
from marin_data.errors import InvalidManifestError, ShardFormatError
from marin_data.layout import BY_SHA256, CHECKED, DATA, LOCK_NAME, MANIFEST, MIRRORS, RECORD, STAGING, \
    UNLISTED as UNLISTED_ON_PURPOSE
from marin_data.fileio.parquet_io import open_parquet
from marin_data.ui import progress as progress_bar

__all__ = ["IGNORED_NAMES", "SCOPE_ALL", "SCOPE_FILTER", "SCOPE_DOWNLOADED", "ProblemKind",
           "Problem", "VerifyReport", "CheckJob", "FileCheck", "check_file", "verify_corpus"]

# Top-level names that belong to writers, not to the corpus: the write lock and the staging folder.
IGNORED_NAMES = frozenset({LOCK_NAME, STAGING, BY_SHA256})  # by-sha256/: a store's copies of its versions
PARTIAL_SUFFIX = ".part"
SCOPE_ALL = "all"  # every subset, the metadata files, the whole tree
SCOPE_FILTER = "subset filter"  # --subset: the metadata files, those subsets' shards and data/<subset>/ folders
SCOPE_DOWNLOADED = "downloaded"  # a partial download (its RECORD): as SCOPE_ALL, for the subsets it holds


class ProblemKind(str, enum.Enum):
    MISSING = "missing"
    TRUNCATED = "truncated"
    OVERSIZED = "oversized"
    MODIFIED = "modified"
    UNREADABLE = "unreadable"
    UNLISTED = "unlisted"
    BAD_FORMAT = "bad_format"
    WRONG_TOKENIZER = "wrong_tokenizer"
    COUNT_MISMATCH = "count_mismatch"
    # a Levanter cache's structure (`marin_data.levanter.checks`)
    BAD_CACHE_FILE = "bad_cache_file"  # a ledger, zarr.json or chunk file missing, malformed or damaged
    UNFINISHED = "unfinished"  # the ledger is not finished, or a sub-cache has no .success
    BAD_OFFSETS = "bad_offsets"  # offsets[0] != rows, decreasing, or the last != the ledger's tokens
    WRONG_DTYPE = "wrong_dtype"
    STATS_MISMATCH = "stats_mismatch"  # .stats.json disagrees with the ledger
    OUT_OF_VOCAB = "out_of_vocab"  # a token id outside [0, vocabulary)
    MISSING_BOS = "missing_bos"  # a document whose first token is not the expected BOS


@dataclass(frozen=True)
class Problem:
    """One finding, by path relative to the corpus root (POSIX separators)."""

    path: str
    kind: ProblemKind
    message: str
    expected: Any = None
    actual: Any = None

    def to_json(self) -> dict:
        return {"path": self.path, "kind": self.kind.value, "message": self.message,
                "expected": _jsonable(self.expected), "actual": _jsonable(self.actual)}


def _jsonable(value: Any) -> Any:
    """``value`` with anything JSON cannot hold (a pyarrow type in a schema finding) turned into its str."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


@dataclass(frozen=True)
class VerifyReport:
    """What `verify_corpus` checked and found. ``ok`` is True when ``problems`` is empty."""

    root: str
    manifest_sha256: str
    subsets: tuple[str, ...]
    deep: bool
    files_checked: int
    bytes_checked: int
    seconds: float  # wall time of the hashing (and deep) phase
    workers: int
    problems: tuple[Problem, ...]
    partial_files: tuple[str, ...]  # leftover *.part files: reported, not failures
    scope: str = SCOPE_ALL  # how the subsets were chosen: SCOPE_ALL, SCOPE_FILTER or SCOPE_DOWNLOADED
    ignored: tuple[str, ...] = ()  # other tools' bookkeeping (`foreign`): its folders, not walked, and files
    recorded: bool = False  # an unpinned copy's files re-hashed against its download's record (`CHECKED`)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_checked / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {
            "root": self.root, "manifest_sha256": self.manifest_sha256, "subsets": list(self.subsets),
            "scope": self.scope,
            "deep": self.deep, "ok": self.ok, "files_checked": self.files_checked,
            "bytes_checked": self.bytes_checked, "seconds": self.seconds, "workers": self.workers,
            "bytes_per_second": self.bytes_per_second,
            "problems": [p.to_json() for p in self.problems], "partial_files": list(self.partial_files),
            "ignored": list(self.ignored),
        }


@dataclass(frozen=True)
class _Target:
    """A listed file to hash: a shard (``shard`` set) or a metadata file named by the manifest."""

    path: str
    bytes: int
    sha256: str
    shard: ShardRecord | None = None


@dataclass(frozen=True)
class CheckJob:
    """One listed file to check, as plain data, so that any engine can run `check_file` on it."""

    root: str  # the corpus directory
    target: _Target
    deep: bool
    tokenizer_sha256: str  # the corpus's, for the deep check


@dataclass(frozen=True)
class FileCheck:
    """What checking one file found, and how many bytes it hashed."""

    problems: tuple[Problem, ...]
    bytes: int


def verify_corpus(
    root: str | os.PathLike,
    *,
    subsets: Iterable[str] | None = None,
    workers: int | None = None,
    deep: bool = False,
    manifest_sha256: str | None = None,
    progress: bool | None = None,
    engine: str = "local",
    engine_address: str | None = None,
    folders: Mapping[str, str] | None = None,
) -> VerifyReport:
    """Re-hash every listed file of a local corpus and look for files nobody listed.

    Args:
        root: the corpus directory.
        subsets: ``--subset`` names or globs: the metadata files, and only these subsets' shards and
            ``data/<subset>/`` folders. None checks the metadata files, the whole tree and every subset, or,
            in a partial download (which has a `marin_data.layout.RECORD`), the subsets it holds.
        workers: hashing threads; default one per available core. With ``engine="ray"``: Ray tasks at once
            (default: every CPU of the Ray cluster, or of this machine for a local instance).
        deep: also read each shard's footer and check format, tokenizer and counts against the index.
        manifest_sha256: the pinned sha256 of ``manifest.json`` (the root of trust).
        progress: show a bytes/s progress bar; None shows it when stderr is a terminal.
        engine: ``"local"`` hashes on threads here; ``"ray"`` runs the checks as Ray tasks.
        engine_address: for ``engine="ray"``, the Ray cluster (``auto``, ``HOST:PORT``); None starts a local
            Ray instance. Its nodes must see the corpus at ``root``.
        folders: subset -> the folder that holds its files, walked for unlisted files when ``subsets`` is
            given; None: ``data/<subset>`` (Parquet shards). Another format's caller passes its own (a pinned
            Levanter store: the subset's name; a single pinned cache: the root, "").

    Returns:
        A `VerifyReport`; the caller decides what a finding means (the CLI exits 1).

    Raises:
        InvalidManifestError: (and subclasses) the manifest or index cannot be trusted, ``subsets``
            matches nothing, or a download record names another manifest. Nothing was checked.
        MissingExtraError, EngineError: ``engine="ray"`` without Ray installed, or a Ray cluster that fails.
    """
    corpus = load_corpus(root, manifest_sha256=manifest_sha256)
    chosen, scope = _choose(corpus, list(subsets or []))
    parquet = corpus.manifest.format == MARIN  # a pinned Levanter cache's files are checked by its own package
    targets = [_Target(s.path, s.bytes, s.sha256, s if parquet else None) for s in corpus.shards_of(chosen)]
    targets += [_Target(p, r.bytes, r.sha256) for p, r in corpus.manifest.files.items()]
    unlisted, partial, ignored = _scan_tree(corpus, chosen if scope == SCOPE_FILTER else None, folders)
    jobs = [CheckJob(str(corpus.root), t, deep, corpus.manifest.tokenizer.sha256)
            for t in sorted(targets, key=lambda t: -t.bytes)]  # largest first: the last file to start is small

    t0 = time.perf_counter()
    with progress_bar(sum(t.bytes for t in targets), "verify", unit="B", unit_scale=True,
                      disable=None if progress is None else not progress) as bar:
        if engine == "local":
            workers = max(1, min(workers or default_workers(), len(targets) or 1))
            results = list(_on_threads(jobs, workers, bar.update))
        else:
            with contextlib.closing(make_engine(engine, workers, address=engine_address)) as pool:
                results = list(_on_engine(jobs, pool, bar.update))
                workers = pool.workers or 1
    seconds = time.perf_counter() - t0
    problems = [p for r in results for p in r.problems]
    nbytes = sum(r.bytes for r in results)
    problems += [Problem(p, ProblemKind.UNLISTED, "not listed in the shard index or manifest") for p in unlisted]
    return VerifyReport(
        root=str(corpus.root), manifest_sha256=corpus.manifest_sha256, subsets=tuple(chosen), scope=scope,
        deep=deep, files_checked=len(targets), bytes_checked=nbytes, seconds=seconds, workers=workers,
        problems=tuple(sorted(problems, key=lambda p: (p.path, p.kind.value))), partial_files=tuple(partial),
        ignored=tuple(ignored),
    )


def _choose(corpus: Corpus, patterns: list[str]) -> tuple[list[str], str]:
    """The subsets to check and why: ``--subset``, else a partial download's record, else all of them."""
    if patterns:
        return select_subsets(corpus.manifest.subsets, patterns), SCOPE_FILTER
    record = read_download_record(corpus.root)
    if record is None:
        return sorted(corpus.manifest.subsets), SCOPE_ALL
    if record.manifest_sha256 != corpus.manifest_sha256:
        raise InvalidManifestError(
            f"{RECORD} describes manifest {record.manifest_sha256}, but manifest.json is "
            f"{corpus.manifest_sha256}: an interrupted or tampered download; run the download again",
            path=str(corpus.root / RECORD), expected=record.manifest_sha256, actual=corpus.manifest_sha256,
        )
    return (select_subsets(corpus.manifest.subsets, record.subsets) if record.subsets else []), SCOPE_DOWNLOADED


def _on_threads(jobs: list[CheckJob], workers: int, on_bytes: Callable[[int], None]) -> Iterator[FileCheck]:
    """Check files on a thread pool: `sha256_file` releases the GIL, and the bar moves with every chunk."""
    lock = threading.Lock()

    def counted(n: int) -> None:
        with lock:
            on_bytes(n)

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verify")
    try:
        futures = [pool.submit(check_file, job, counted) for job in jobs]
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        # On Ctrl-C, drop the queued files; running ones finish their current file.
        pool.shutdown(wait=True, cancel_futures=True)


def _on_engine(jobs: list[CheckJob], engine: Engine, on_bytes: Callable[[int], None]) -> Iterator[FileCheck]:
    """Check files as an engine's tasks; the bar moves a file at a time (a task elsewhere cannot move it)."""
    for i, result in engine.map_unordered(check_file, jobs):
        on_bytes(jobs[i].target.bytes)
        yield result


def check_file(job: CheckJob, on_bytes: Callable[[int], None] | None = None) -> FileCheck:
    """Hash one listed file against its listed size and sha256 and, with ``job.deep``, inspect a shard.

    A top-level function of plain data, so a thread here or a Ray task on another node runs the same check.
    """
    target = job.target
    path = Path(job.root) / target.path
    want = {"bytes": target.bytes, "sha256": target.sha256}
    read = 0

    def found(kind: ProblemKind, message: str, actual: Any = None) -> FileCheck:
        return FileCheck((Problem(target.path, kind, message, expected=want, actual=actual),), read)

    try:
        digest, read = sha256_file(path, on_bytes=on_bytes)
    except (FileNotFoundError, NotADirectoryError):
        return found(ProblemKind.MISSING, "listed but not on disk")
    except OSError as e:
        return found(ProblemKind.UNREADABLE, f"cannot be read: {e.strerror or e}", str(e))
    got = {"bytes": read, "sha256": digest}
    if read < target.bytes:
        return found(ProblemKind.TRUNCATED, f"{read} bytes, {target.bytes} listed", got)
    if read > target.bytes:
        return found(ProblemKind.OVERSIZED, f"{read} bytes, {target.bytes} listed", got)
    if digest != target.sha256:
        return found(ProblemKind.MODIFIED,
                     f"sha256 {digest[:12]}… differs from the listed {target.sha256[:12]}… (same size)", got)
    if target.shard is not None:
        check = _inspect if job.deep else _check_format
        return FileCheck(tuple(check(path, target.shard, job.tokenizer_sha256)), read)
    return FileCheck((), read)


def _check_format(path: Path, shard: ShardRecord, tokenizer_sha256: str) -> list[Problem]:
    """The check every verify makes of a shard whose bytes match the index: its schema, from the footer
    (a few KB read; the loader would serve tokens of another type reinterpreted)."""
    try:
        with open_parquet(path) as pf:
            check_schema(pf.schema_arrow, path)
    except ShardFormatError as e:
        return [Problem(shard.path, ProblemKind.BAD_FORMAT, e.message, expected=e.expected, actual=e.actual)]
    except (OSError, ValueError) as e:
        return [Problem(shard.path, ProblemKind.BAD_FORMAT, f"not a readable Parquet file: {e}")]
    return []


def _inspect(path: Path, shard: ShardRecord, tokenizer_sha256: str) -> list[Problem]:
    """The deep checks of one shard whose bytes match the index: footer, tokenizer, counts."""
    try:
        found = inspect_shard(path)
    except ShardFormatError as e:
        return [Problem(shard.path, ProblemKind.BAD_FORMAT, e.message, expected=e.expected, actual=e.actual)]
    problems = []
    if found.tokenizer_sha256 != tokenizer_sha256:
        problems.append(Problem(shard.path, ProblemKind.WRONG_TOKENIZER,
                                f"tokenized with {found.tokenizer_sha256}, the corpus uses {tokenizer_sha256}",
                                expected=tokenizer_sha256, actual=found.tokenizer_sha256))
    if 0 < found.tokens - shard.tokens <= found.docs:  # empty documents? the footer counts each as a value
        try:
            found = replace(found, tokens=count_tokens(path))
        except (OSError, ValueError) as e:
            return [Problem(shard.path, ProblemKind.BAD_FORMAT, f"its tokens cannot be read: {e}")]
    fields = ("docs", "tokens", "row_groups")
    bad = [f for f in fields if getattr(found, f) != getattr(shard, f)]
    if bad:
        expected = {f: getattr(shard, f) for f in bad}
        actual = {f: getattr(found, f) for f in bad}
        problems.append(Problem(shard.path, ProblemKind.COUNT_MISMATCH,
                                "; ".join(f"{f} {actual[f]}, index says {expected[f]}" for f in bad),
                                expected=expected, actual=actual))
    return problems


def _scan_tree(corpus: Corpus, chosen: list[str] | None,
               folders: Mapping[str, str] | None) -> tuple[list[str], list[str], list[str]]:
    """Files under the tree that nothing lists (``unlisted``), leftover ``*.part`` files (``partial``) and
    the other tools' bookkeeping found and skipped (``ignored``: its folders, and executor files, `foreign`).

    ``chosen=None`` walks the whole corpus; otherwise only the chosen subsets' folders (``folders``, else
    ``data/<subset>/`` of a Parquet corpus), without descending into the folders of subsets that were not
    chosen (``data/a/b`` inside ``data/a``).
    """
    known = {MANIFEST, MIRRORS, RECORD, CHECKED, *UNLISTED_ON_PURPOSE, *corpus.manifest.files,
             *(s.path for s in corpus.shards)}
    if chosen is None:
        tops, skip = [""], set(IGNORED_NAMES)
    else:
        folder = folders or {s: f"{DATA}/{s}" for s in corpus.manifest.subsets}
        tops = [folder[s] for s in chosen]
        skip = {folder[s] for s in corpus.manifest.subsets} - set(tops)
    unlisted: set[str] = set()
    partial: set[str] = set()
    ignored: set[str] = set()
    for top in tops:
        for dirpath, dirnames, filenames in os.walk(corpus.root / top):
            rel_dir = PurePosixPath(Path(dirpath).relative_to(corpus.root).as_posix())  # "." at the root
            ignored.update(str(rel_dir / d) for d in dirnames if str(rel_dir / d) in FOREIGN_FOLDERS)
            dirnames[:] = sorted(d for d in dirnames if str(rel_dir / d) not in skip | FOREIGN_FOLDERS.keys())
            for name in filenames:
                rel = str(rel_dir / name)
                if rel in IGNORED_NAMES or rel in known:
                    continue
                if foreign(rel):
                    ignored.add(rel)
                    continue
                (partial if name.endswith(PARTIAL_SUFFIX) else unlisted).add(rel)
    return sorted(unlisted), sorted(partial), sorted(ignored)
