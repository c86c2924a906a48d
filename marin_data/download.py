"""``download``: fetch chosen subsets of a corpus from a store, verified, resumable, with mirror fallback.

Order of work, and why:

1. ``manifest.json`` first, checked against ``--manifest-sha256`` when pinned (the root of trust: a tampered
   mirror cannot vouch for itself), then ``shards.parquet``, checked against the manifest's digest. Subsets
   are resolved from them (`select_subsets`): no bucket listing, which is slow and may be forbidden.
2. Every metadata file the manifest lists (tokenizer.json, SHA256SUMS, the dataset card...) and every shard
   of the chosen subsets is fetched on a thread pool, hashed while it streams, and renamed into place only
   once its size and SHA-256 match (`marin_data.atomic`). A file already present and matching is kept.
3. ``manifest.json`` (verbatim, so ``load_corpus(DIR, manifest_sha256=...)`` still verifies) and then
   `RECORD` are written last. `RECORD` names the subsets this directory holds, so ``marin-data verify DIR``
   checks a partial download against what was fetched.

Resume: a file's bytes go into a partial file beside its final name (`marin_data.partial`), a fixed name,
so a re-run after a crash (even ``kill -9``) finds it and continues from what is there. A wrong result is
discarded and fetched again; nothing unverified ever gets a final name.

Faults (issue 3): a dropped connection or truncated body resumes from the bytes already written; 429/503
wait for ``Retry-After``; other 5xx back off (`marin_data.retry`); a 200 where a 206 was asked restarts
the file from byte 0 with that body (fetched in ranges, the body is cut to the range asked for); a checksum
mismatch discards the file and refetches it. When the
retries on one store are spent, the next mirror continues the same partial file.

Requests: one GET per file, from its resume offset to the end, while there are at least as many files left
as workers: shards are 256 MiB-2 GiB and a subset has many, so parallelism across files fills a link (a
real S3 serves ~100 MB/s per connection), and one streaming GET is what every server serves best (moto and
other simple servers copy the whole object for each ranged GET). When fewer files of at least two
`PART_BYTES` are left than workers — a subset of a few large shards — the spare workers go to ranges: each
such file is fetched as ``workers // large files`` parallel byte ranges (`marin_data.partial.RangedPartial`),
each range resumable on its own, the whole hashed in file order as ranges complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from marin_data.atomic import atomic_write_bytes, sha256_file
from marin_data.errors import (
    InvalidManifestError,
    ManifestHashMismatchError,
    RemoteError,
    RetryableRemoteError,
    ShardChecksumError,
    TransferFailedError,
)
from marin_data.lock import corpus_lock
from marin_data.manifest import MANIFEST, SHARDS_INDEX, Manifest, load_corpus, read_shard_index, select_subsets
from marin_data.partial import PARTIAL_SUFFIX, RANGES_SUFFIX, open_partial, partial_path, resumed_bytes
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores import Store, open_store
from marin_data.ui import progress as progress_bar

__all__ = [
    "PARTIAL_SUFFIX",
    "RANGES_SUFFIX",
    "PART_BYTES",
    "RECORD",
    "DOWNLOAD_POLICY",
    "FileTask",
    "DownloadPlan",
    "DownloadReport",
    "DownloadRecord",
    "read_download_record",
    "plan_download",
    "download",
    "fetch_file",
]

PART_BYTES = 64 << 20  # smallest byte range of a file fetched in parallel ranges
RECORD = ".marin-download.json"  # what this directory holds: see `DownloadRecord`
METADATA_LIMIT = 1 << 30  # manifest.json and shards.parquet are read into memory; refuse absurd ones
# A checksum mismatch is worth a retry too: the bytes may have been damaged in flight.
DOWNLOAD_POLICY = RetryPolicy(retry_on=(RetryableRemoteError, ShardChecksumError))


@dataclass(frozen=True)
class FileTask:
    path: str
    bytes: int
    sha256: str
    subset: str | None = None  # None for a metadata file


@dataclass(frozen=True)
class DownloadPlan:
    """What a download would fetch: `download` with ``dry_run=True`` returns it alone."""

    source: str
    manifest_sha256: str
    subsets: tuple[str, ...]
    files: tuple[FileTask, ...]  # metadata files first, then the chosen subsets' shards
    tokens: int

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


@dataclass(frozen=True)
class DownloadReport:
    plan: DownloadPlan
    dest: str
    dry_run: bool
    fetched: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # already present with the right size and SHA-256
    failed: tuple[tuple[str, str], ...] = ()  # (path, why), after every retry and mirror
    bytes_fetched: int = 0  # bytes received, including any that were discarded and fetched again
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def error(self) -> TransferFailedError:
        lines = "".join(f"\n  {path}: {why}" for path, why in self.failed)
        return TransferFailedError(f"{len(self.failed)} of {len(self.plan.files)} files failed:{lines}",
                                   path=self.dest, failures=list(self.failed))


@dataclass(frozen=True)
class DownloadRecord:
    """The JSON file `RECORD` in a downloaded directory: which subsets of which manifest it holds.

    Shape: ``{"schema_version": 1, "source": "s3://...", "manifest_sha256": "<hex>",
    "subsets": ["pretrain/code", ...]}``. It is written after ``manifest.json`` and lists only subsets whose
    every shard was verified, so a reader may check exactly those.
    """

    source: str
    manifest_sha256: str
    subsets: tuple[str, ...]
    schema_version: int = 1

    def to_json(self) -> bytes:
        doc = {"schema_version": self.schema_version, "source": self.source,
               "manifest_sha256": self.manifest_sha256, "subsets": sorted(self.subsets)}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def read_download_record(root: str | os.PathLike) -> DownloadRecord | None:
    """The record of a partial download in ``root``; None when there is none (a full corpus)."""
    path = Path(root) / RECORD
    try:
        doc = json.loads(path.read_bytes())
        return DownloadRecord(source=str(doc["source"]), manifest_sha256=str(doc["manifest_sha256"]),
                              subsets=tuple(str(s) for s in doc["subsets"]),
                              schema_version=int(doc["schema_version"]))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as e:
        raise InvalidManifestError(f"malformed download record: {e!r}", path=str(path)) from e


def plan_download(
    stores: Sequence[Store], *, subsets: Sequence[str] | None, manifest_sha256: str | None = None,
    policy: RetryPolicy = DOWNLOAD_POLICY,
) -> tuple[DownloadPlan, bytes, bytes]:
    """Read and check the manifest and shard index; resolve ``subsets``.

    Returns:
        The plan, and the verbatim bytes of ``manifest.json`` and ``shards.parquet``.

    Raises:
        ManifestHashMismatchError: no store has a manifest matching ``manifest_sha256``.
        InvalidManifestError: (and `UnsafePathError`) a malformed manifest or index, or one naming paths
            outside the corpus; ``subsets`` matching nothing.
        RemoteError: no store could serve them.
    """
    manifest_bytes, digest = _fetch_manifest(stores, manifest_sha256, policy)
    manifest = Manifest.from_json(manifest_bytes, f"{stores[0].url}/{MANIFEST}")
    rec = manifest.files.get(SHARDS_INDEX)
    if rec is None:
        raise InvalidManifestError(f"manifest does not list {SHARDS_INDEX}", path=stores[0].describe(MANIFEST))
    index_bytes = _from_first(stores, lambda s: _checked_bytes(s, FileTask(SHARDS_INDEX, rec.bytes, rec.sha256)),
                              policy, SHARDS_INDEX)
    shards = read_shard_index(index_bytes)
    chosen = select_subsets(manifest.subsets, list(subsets or []))
    wanted = set(chosen)
    picked = [s for s in shards if s.subset in wanted]
    files: dict[str, FileTask] = {p: FileTask(p, r.bytes, r.sha256) for p, r in sorted(manifest.files.items())}
    for s in picked:
        if files.setdefault(s.path, FileTask(s.path, s.bytes, s.sha256, s.subset)).subset != s.subset:
            raise InvalidManifestError(f"{s.path} is listed as a metadata file and as a shard",
                                       path=stores[0].describe(SHARDS_INDEX))
    plan = DownloadPlan(source=stores[0].url, manifest_sha256=digest, subsets=tuple(chosen),
                        files=tuple(files.values()), tokens=sum(s.tokens for s in picked))
    return plan, manifest_bytes, index_bytes


def download(
    source: str | os.PathLike,
    *,
    subsets: Sequence[str] | None,
    dest: str | os.PathLike,
    mirrors: Sequence[str] = (),
    manifest_sha256: str | None = None,
    workers: int = 8,
    dry_run: bool = False,
    policy: RetryPolicy = DOWNLOAD_POLICY,
    progress: bool | None = None,
    part_bytes: int = PART_BYTES,
    **store_options,
) -> DownloadReport:
    """Download the chosen subsets of the corpus at ``source`` into ``dest``, verified and resumable.

    Args:
        source: ``s3://bucket/prefix`` or a local corpus directory.
        subsets: names or globs (`select_subsets`); None or empty for every subset.
        dest: the local directory; created if needed; may already hold an earlier (partial) download.
        mirrors: fallback stores (URLs or paths) tried in order when one has failed a file.
        manifest_sha256: the pinned sha256 of ``manifest.json``.
        workers: files fetched in parallel.
        dry_run: only plan: nothing is written.
        policy: retry knobs (tests shrink the waits).
        progress: show a progress bar; None shows it when stderr is a terminal.
        part_bytes: with fewer large files (at least twice this size) left than workers, each is fetched as
            parallel byte ranges of at least this size (module docstring); 0: one GET per file always.
        **store_options: passed to `open_store` for the source and every mirror (``endpoint_url``,
            ``anonymous``, ``requester_pays``, ``profile``).

    Returns:
        A `DownloadReport`; ``report.failed`` lists every file that failed (the CLI exits non-zero).

    Raises:
        InvalidManifestError, ManifestHashMismatchError, UnsafePathError: the corpus description is not
            trustworthy; nothing was written.
        RemoteError: the source cannot be read at all (bad URL, no such bucket, no access).
        CorpusLockedError: another process is writing ``dest``.
    """
    options = {"max_connections": 2 * workers + 2, **store_options}  # files and ranges of large ones in flight
    stores = [open_store(url, **options) for url in [source, *mirrors]]
    plan, manifest_bytes, index_bytes = plan_download(stores, subsets=subsets, manifest_sha256=manifest_sha256,
                                                      policy=policy)
    root = Path(dest)
    if dry_run:
        return DownloadReport(plan=plan, dest=str(root), dry_run=True)
    with corpus_lock(root):  # two downloads into one directory would write the same partial files
        previous = read_download_record(root)
        if previous is not None and previous.manifest_sha256 != plan.manifest_sha256:
            (root / RECORD).unlink()  # it describes another manifest; nothing it says holds any more
            previous = None
        if _read_or_none(root / SHARDS_INDEX) != index_bytes:
            atomic_write_bytes(root / SHARDS_INDEX, index_bytes)
        report = _fetch_all(plan, root, stores, workers=workers, policy=policy, progress=progress,
                            part_bytes=part_bytes)
        failed = {p for p, _ in report.failed}
        failed_subsets = {t.subset for t in plan.files if t.path in failed}
        if None not in failed_subsets:  # every metadata file is in place: the manifest may go in, last
            atomic_write_bytes(root / MANIFEST, manifest_bytes)
            held = (set(previous.subsets if previous else ()) | set(plan.subsets)) - failed_subsets
            record = DownloadRecord(source=plan.source, manifest_sha256=plan.manifest_sha256,
                                    subsets=tuple(sorted(held)))
            atomic_write_bytes(root / RECORD, record.to_json())
            load_corpus(root, manifest_sha256=plan.manifest_sha256)  # the local root of trust holds
    return report


def fetch_file(root: str | os.PathLike, task: FileTask, stores: Sequence[Store], *,
               policy: RetryPolicy = DOWNLOAD_POLICY) -> int:
    """Fetch one file to ``root/task.path`` on the machinery of `download`: hashed while it streams, renamed
    into place only once its size and SHA-256 match ``task``, retried, then tried on the next store.

    The loader's remote shard cache (`marin_data.loader.remote_cache`) fetches shards through it.

    Returns:
        Bytes received (counting any that were discarded and fetched again).

    Raises:
        TransferFailedError: every store failed; ``failures`` holds one ``(path, why)`` naming each store's error.
    """
    meter = _Meter(progress_bar(None, "fetch", disable=True))
    why = _fetch_file(Path(root), task, stores, policy, meter)
    if why is not None:
        raise TransferFailedError(f"could not fetch a verified copy: {why}", path=task.path,
                                  failures=[(task.path, why)])
    return meter.received


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _fetch_manifest(stores: Sequence[Store], pinned: str | None, policy: RetryPolicy) -> tuple[bytes, str]:
    """The first manifest that matches the pin (any, unpinned), trying each store in turn."""
    pinned = pinned.strip().lower() if pinned else None

    def get(store: Store) -> tuple[bytes, str]:
        data = retry_call(lambda: store.read_bytes(MANIFEST, limit=METADATA_LIMIT), policy=policy,
                          what=store.describe(MANIFEST))
        digest = hashlib.sha256(data).hexdigest()
        if pinned is not None and digest != pinned:
            raise ManifestHashMismatchError(
                f"manifest sha256 is {digest}, but {pinned} was pinned: this mirror's copy differs",
                path=store.describe(MANIFEST), expected=pinned, actual=digest)
        return data, digest

    return _from_first(stores, get, None, MANIFEST)


def _from_first(stores: Sequence[Store], get: Callable, policy: RetryPolicy | None, what: str):
    """``get(store)`` (retried under ``policy`` when given) from the first store where it succeeds; else
    re-raise the first store's error, which names the primary source."""
    errors: list[BaseException] = []
    for store in stores:
        try:
            return get(store) if policy is None else retry_call(lambda: get(store), policy=policy,
                                                                what=store.describe(what))
        except (RemoteError, ShardChecksumError, ManifestHashMismatchError) as e:
            errors.append(e)
    raise errors[0]


def _checked_bytes(store: Store, task: FileTask) -> bytes:
    data = store.read_bytes(task.path, limit=max(task.bytes, 1))
    digest = hashlib.sha256(data).hexdigest()
    if (digest, len(data)) != (task.sha256, task.bytes):
        raise ShardChecksumError(f"sha256/size {digest[:12]}…/{len(data)} != {task.sha256[:12]}…/{task.bytes} "
                                 "listed in the manifest", path=store.describe(task.path),
                                 expected=task.sha256, actual=digest)
    return data


# --- fetching files -----------------------------------------------------------------------------------

@dataclass
class _Meter:
    """Bytes received, counted from several threads, behind the progress bar."""

    bar: object
    received: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)  # set on Ctrl-C: workers quit mid-file

    def got(self, n: int) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt  # what is written so far stays in the partial file, for the next run
        with self.lock:
            self.received += n
            self.bar.update(n)


def _fetch_all(plan: DownloadPlan, root: Path, stores: Sequence[Store], *, workers: int,
               policy: RetryPolicy, progress: bool | None, part_bytes: int) -> DownloadReport:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify-existing") as pool:
        present = list(pool.map(lambda t: _already_there(root, t), plan.files))
    todo = [t for t, ok in zip(plan.files, present) if not ok]
    skipped = tuple(t.path for t, ok in zip(plan.files, present) if ok)
    resumed = sum(resumed_bytes(partial_path(root / t.path)) for t in todo)
    # Spare workers fetch ranges of the large files there are (the small ones take a moment each).
    ranges = max(1, workers // max(1, sum(t.bytes >= 2 * part_bytes for t in todo))) if part_bytes > 0 else 1
    bar = progress_bar(max(0, sum(t.bytes for t in todo) - resumed), "download", unit="B", unit_scale=True,
                       disable=None if progress is None else not progress)
    meter = _Meter(bar)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="download")
    try:
        results = list(pool.map(lambda t: _fetch_file(root, t, stores, policy, meter, ranges, part_bytes), todo))
    except BaseException:
        meter.stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    failed = tuple((t.path, why) for t, why in zip(todo, results) if why is not None)
    fetched = tuple(t.path for t, why in zip(todo, results) if why is None)
    return DownloadReport(plan=plan, dest=str(root), dry_run=False, fetched=fetched, skipped=skipped,
                          failed=failed, bytes_fetched=meter.received, seconds=time.perf_counter() - t0)


def _already_there(root: Path, task: FileTask) -> bool:
    """True when the final file holds exactly the listed bytes. A wrong one never stays under its final
    name: a shorter one becomes the partial file (its prefix may be good), anything else is removed."""
    final = root / task.path
    try:
        if final.stat().st_size == task.bytes and sha256_file(final)[0] == task.sha256:
            return True
    except FileNotFoundError:
        return False
    partial = partial_path(final)
    if final.stat().st_size < task.bytes and not partial.exists():
        os.replace(final, partial)
    else:
        final.unlink()
    return False


def _fetch_file(root: Path, task: FileTask, stores: Sequence[Store], policy: RetryPolicy,
                meter: _Meter, ranges: int = 1, part_bytes: int = PART_BYTES) -> str | None:
    """Fetch one file into place (in up to ``ranges`` parallel ranges of at least ``part_bytes`` when it has two
    or more, or a partial in ranges is there); return None on success, else why it failed on every store."""
    final = root / task.path
    partial = open_partial(final, task, ranges=ranges, part_bytes=part_bytes)
    errors = []
    try:
        for store in stores:
            try:
                retry_call(lambda: partial.fetch(store, meter), policy=policy, what=store.describe(task.path))
            except (RemoteError, ShardChecksumError) as e:
                errors.append(f"{store.url}: {e.message}")
                continue
            partial.commit(final)
            return None
    finally:
        partial.close()
    return "; ".join(errors)
