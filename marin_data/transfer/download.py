"""``download``: fetch chosen subsets of a corpus from a store, verified, resumable, with mirror fallback.

`download` plans from the manifest and shard index (`marin_data.transfer.plan`; the manifest checked against a
pinned ``manifest_sha256``; a pin kept apart from its data reads its shards from where the manifest's ``data``
says they are: `marin_data.transfer.apart`), fetches every metadata file and every shard of the chosen subsets
on a thread pool (`marin_data.transfer.fetch`: hashed while they stream, renamed into place only once size and
SHA-256 match) and the datasheet (which the manifest cannot list), then writes ``manifest.json`` and the
download record last. A re-run after a crash continues each file from its partial file
(`marin_data.transfer.partial`); transient faults are retried, then the next mirror continues the same partial
file; a store that keeps failing is tried after the others for the rest of the run (`marin_data.stores.order`).
The order of work, the faults handled and the request strategy (one GET per file, or parallel ranges for a few
large files): docs/data.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.record import DownloadRecord, read_download_record
from marin_data.errors import RemoteError, TransferFailedError
from marin_data.layout import MANIFEST, RECORD, SHARDS_INDEX, UNLISTED
from marin_data.fileio.lock import corpus_lock
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores import open_store
from marin_data.stores.base import METADATA_LIMIT, Store
from marin_data.stores.local import LocalStore
from marin_data.stores.order import StoreOrder
from marin_data.transfer.apart import apart_order, data_url
from marin_data.transfer.fetch import PART_BYTES, ByteMeter, already_there, fetch_one
from marin_data.transfer.partial import partial_path, resumed_bytes
from marin_data.transfer.plan import DOWNLOAD_POLICY, DownloadPlan, plan_download
from marin_data.transfer.versions import versioned
from marin_data.ui import plural, printable
from marin_data.ui import progress as progress_bar

__all__ = ["DownloadReport", "download", "fetch_all"]



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
    notes: tuple[str, ...] = ()  # what was left out and why, in a line each (a stale datasheet)
    sha256: dict[str, str] = field(default_factory=dict)  # path -> SHA-256 of each file hashed as it arrived

    @property
    def ok(self) -> bool:
        return not self.failed

    def error(self) -> TransferFailedError:
        lines = "".join(f"\n  {printable(path)}: {printable(why)}" for path, why in self.failed)
        return TransferFailedError(f"{len(self.failed)} of {plural(len(self.plan.files), 'file')} failed:{lines}",
                                   path=self.dest, failures=list(self.failed))


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
    known_manifest: bytes | None = None,
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
        known_manifest: the ``manifest.json`` its format was told from, read from ``source`` (`open_source`):
            checked against ``manifest_sha256`` as if read again, not read again.
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
    order = StoreOrder([open_store(url, **options) for url in [source, *mirrors]])
    plan, manifest_bytes, index_bytes = plan_download(order, subsets=subsets, manifest_sha256=manifest_sha256,
                                                      policy=policy, known_manifest=known_manifest)
    stores = _apart(order.using(lambda s: versioned(s, manifest_bytes)), plan, manifest_bytes, options,
                    order.primary)
    root = Path(dest)
    if dry_run:
        return DownloadReport(plan=plan, dest=str(root), dry_run=True)
    with corpus_lock(root):  # two downloads into one directory would write the same partial files
        previous = read_download_record(root)
        if previous is not None and previous.manifest_sha256 != plan.manifest_sha256:
            (root / RECORD).unlink()  # it describes another manifest; nothing it says holds any more
            previous = None
        fetched_index = _read_or_none(root / SHARDS_INDEX) != index_bytes
        if fetched_index:
            atomic_write_bytes(root / SHARDS_INDEX, index_bytes)
        report = fetch_all(plan, root, stores, workers=workers, policy=policy, progress=progress,
                            part_bytes=part_bytes)
        if fetched_index:  # fetched while planning: it was not "already present"
            report = replace(report, fetched=(SHARDS_INDEX, *report.fetched),
                             skipped=tuple(p for p in report.skipped if p != SHARDS_INDEX),
                             bytes_fetched=report.bytes_fetched + len(index_bytes))
        failed = {p for p, _ in report.failed}
        failed_subsets = {t.subset for t in plan.files if t.path in failed}
        if None not in failed_subsets:  # every metadata file is in place: the manifest may go in, last
            report = _fetch_documents(report, root, stores, policy)
            atomic_write_bytes(root / MANIFEST, manifest_bytes)
            held = (set(previous.subsets if previous else ()) | set(plan.subsets)) - failed_subsets
            record = DownloadRecord(source=plan.source, manifest_sha256=plan.manifest_sha256,
                                    subsets=tuple(sorted(held)))
            atomic_write_bytes(root / RECORD, record.to_json())
            load_corpus(root, manifest_sha256=plan.manifest_sha256)  # the local root of trust holds
    return report


def _apart(stores: StoreOrder, plan: DownloadPlan, manifest_bytes: bytes, options: dict, source: Store
           ) -> StoreOrder:
    """``stores``, the primary reading a pin kept apart from its data (`data_url`: the manifest's ``data``, unless
    the ``source`` is a local folder holding them) as `ApartStore`: its shards from where the data is."""
    manifest = Manifest.from_json(manifest_bytes, stores.primary.describe(MANIFEST))
    data = data_url(manifest, source.root if isinstance(source, LocalStore) else None)
    return apart_order(stores, data, (t.path for t in plan.files if t.subset is not None), options)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _fetch_documents(report: DownloadReport, root: Path, stores: StoreOrder,
                     policy: RetryPolicy) -> DownloadReport:
    """``report`` with the documentation the manifest cannot list fetched too (`UNLISTED`: the datasheet).

    It has no listed digest, so its size is bounded and it is kept only when it states the sha256 of the
    manifest being downloaded, as publish requires of it: a datasheet of another version would hand readers
    a pin that does not verify. A store that fails after its retries passes to the next mirror, as a listed
    file's fetch does, and so does one without it (404). It fails the download only when every store
    failed; when the others answered that they hold none, that is noted instead.
    """
    for rel in UNLISTED:
        errors: list[RemoteError] = []
        for store, tried in stores.tries(policy):
            try:
                data = retry_call(lambda: store.read_bytes(rel, limit=METADATA_LIMIT), policy=tried,
                                  what=store.describe(rel))
            except RemoteError as e:
                if e.status != 404:
                    errors.append(e)
                continue
            if report.plan.manifest_sha256 not in data.decode("utf-8", errors="replace"):
                note = f"{store.describe(rel)} states another manifest sha256: not kept"
                report = replace(report, notes=(*report.notes, note))
            elif _read_or_none(root / rel) == data:
                report = replace(report, skipped=(*report.skipped, rel))
            else:
                atomic_write_bytes(root / rel, data, root=root)
                report = replace(report, fetched=(*report.fetched, rel), bytes_fetched=report.bytes_fetched + len(data))
            break
        else:
            if len(errors) == len(stores.stores):
                report = replace(report, failed=(*report.failed, (rel, str(errors[0]))))
            elif errors:
                note = f"{rel}: not fetched ({errors[0]}); the other stores hold none"
                report = replace(report, notes=(*report.notes, note))
    return report


# --- fetching files -----------------------------------------------------------------------------------

def fetch_all(plan: DownloadPlan, root: Path, stores: StoreOrder, *, workers: int,
              policy: RetryPolicy, progress: bool | None, part_bytes: int) -> DownloadReport:
    """Fetch every file of ``plan`` not already in place under ``root`` (`fetch_one` on a thread pool, the
    big ones in parallel ranges) from the stores of the run's ``stores``, with one progress bar; the caller
    holds the folder's lock."""
    t0 = time.perf_counter()
    seen: dict[str, str] = {}  # filled from several threads: one key each
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify-existing") as pool:
        present = list(pool.map(lambda t: already_there(root, t, seen), plan.files))
    todo = [t for t, ok in zip(plan.files, present) if not ok]
    skipped = tuple(t.path for t, ok in zip(plan.files, present) if ok)
    resumed = sum(resumed_bytes(partial_path(root / t.path)) for t in todo)
    # Spare workers fetch ranges of the large files there are (the small ones take a moment each).
    ranges = max(1, workers // max(1, sum(t.bytes >= 2 * part_bytes for t in todo))) if part_bytes > 0 else 1
    bar = progress_bar(max(0, sum(t.bytes for t in todo) - resumed), "download", unit="B", unit_scale=True,
                       disable=None if progress is None else not progress)
    meter = ByteMeter(bar)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="download")
    try:
        results = list(pool.map(lambda t: fetch_one(root, t, stores, policy, meter, ranges, part_bytes, seen), todo))
    except BaseException:
        meter.stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    failed = tuple((t.path, why) for t, why in zip(todo, results) if why is not None)
    fetched = tuple(t.path for t, why in zip(todo, results) if why is None)
    return DownloadReport(plan=plan, dest=str(root), dry_run=False, fetched=fetched, skipped=skipped,
                          failed=failed, bytes_fetched=meter.received, seconds=time.perf_counter() - t0, sha256=seen)
