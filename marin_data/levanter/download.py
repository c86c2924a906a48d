"""``download`` of a Levanter cache or store that nothing pins (Marin's own store, as it is published).

No manifest lists these files' digests, so the plan comes from the source itself: the chosen cells are
opened first (ledgers and ``zarr.json``: an unfinished or unreadable cell is refused before anything is
fetched), then listed, each file with the size the listing gives and every digest the store vouches for
(`marin_data.stores.base.Store.vouched`: the Hub's LFS SHA-256, S3's checksums and plain-MD5 ETags, GCS's
``x-goog-hash``). The files are fetched on the machinery of a corpus download
(`marin_data.transfer.download.fetch_all`: partial files, resume after a crash, retries, ``mirrors`` tried
in turn, a store that keeps failing tried last), each hashed as it streams and renamed into place only once
it has its listed size and every vouched digest. What each was checked against is recorded beside the copy
(`marin_data.levanter.checked`), so ``verify`` re-hashes it later and ``adopt`` says what it pins. Then the
structural checks run on the local copy (`verify_source`): offsets against the ledgers, every chunk file's
crc32c'd index, sub-cache totals. ``marin-data adopt DEST`` then pins the copy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from marin_data.corpus.foreign import foreign
from marin_data.corpus.names import is_reserved, safe_relpath, select_subsets
from marin_data.corpus.verify import VerifyReport
from marin_data.errors import UnknownSubsetError, UnsafePathError, VerificationFailedError, shown
from marin_data.formats.base import Downloaded
from marin_data.layout import CHECKED
from marin_data.levanter.cache import open_cache
from marin_data.levanter.checked import SIZE_ONLY, Checked, checked_entry, read_checked, write_checked
from marin_data.levanter.detect import CACHE, Source
from marin_data.levanter.verify import REMOTE_WORKERS, verify_source
from marin_data.fileio.atomic import sha256_file
from marin_data.fileio.lock import corpus_lock
from marin_data.retry import RetryPolicy
from marin_data.stores import open_store
from marin_data.stores.base import ObjectInfo, Store
from marin_data.stores.order import StoreOrder
from marin_data.transfer.download import DownloadReport, fetch_all
from marin_data.transfer.fetch import PART_BYTES
from marin_data.transfer.plan import DOWNLOAD_POLICY, DownloadPlan, FileTask
from marin_data.ui import format_table, human_bytes, human_count, plural, printable

__all__ = ["CacheDownload", "cell_listing", "download_cache"]

SHOWN = 10  # size-only files named in the summary


@dataclass(frozen=True)
class CacheDownload:
    """What `download_cache` did: the transfer (its ``plan.manifest_sha256`` is empty: nothing pins it) and,
    once every file arrived, the structural checks of the copy (None on a dry run or a failed transfer)."""

    transfer: DownloadReport
    checks: VerifyReport | None
    checked: Mapping[str, Checked] = field(default_factory=dict)  # path -> what it was checked against

    @property
    def size_only(self) -> tuple[str, ...]:
        """The files in place that the source vouched no digest for: checked by their size only."""
        return tuple(p for p, e in self.checked.items() if not e.against_source)

    def _checked_lines(self) -> list[tuple[str, bool]]:
        """How the files in place were checked: counts by digest, and the size-only ones by name (bounded)."""
        by: dict[str, int] = {}
        for e in self.checked.values():
            by[e.checked] = by.get(e.checked, 0) + 1
        how = ", ".join(f"{n} by {a}" for a, n in sorted(by.items()) if a != SIZE_ONLY) or "none by a digest"
        only = self.size_only
        lines = [(f"not pinned: {plural(len(self.checked), 'file')} in place checked against the source: {how}, "
                  f"{len(only)} by size only (recorded in {CHECKED}); `marin-data adopt {self.transfer.dest} "
                  "--tokenizer TOK` pins the copy", False)]
        lines += [(f"  size only: {printable(p)}", False) for p in only[:SHOWN]]
        if len(only) > SHOWN:
            lines.append((f"  ... and {len(only) - SHOWN} more checked by size only", False))
        return lines

    @property
    def ok(self) -> bool:
        return self.transfer.ok and (self.checks is None or self.checks.ok)

    def downloaded(self) -> Downloaded:
        """What ``marin-data download`` prints of it: sizes (a dry run: the files), then the copy's structure."""
        report, plan = self.transfer, self.transfer.plan
        if report.dry_run:
            rows = [(f.path, human_bytes(f.bytes)) for f in plan.files]
            return Downloaded(((format_table(["file", "bytes"], rows), False), (
                f"Would fetch {plural(len(plan.files), 'file')}, {human_bytes(plan.bytes)}, "
                f"{human_count(plan.tokens)} tokens ({plural(len(plan.subsets), 'cell')}) into {report.dest}; not "
                "pinned: files are checked by every digest the store vouches for (else by size only), then the "
                "copy's structure.", False)), None, self)
        lines = [(f"{'Downloaded' if report.ok else 'INCOMPLETE'}: {plural(len(report.fetched), 'file')} fetched "
                  f"({human_bytes(report.bytes_fetched)} in {report.seconds:.1f}s), {len(report.skipped)} already "
                  f"present at their listed size, {len(report.failed)} failed; {plural(len(plan.subsets), 'cell')} in "
                  f"{report.dest}.", False), *self._checked_lines()]
        if not report.ok:
            return Downloaded(tuple(lines), report.error(), self)
        checked = plural(self.checks.files_checked, 'chunk file')
        lines.append((f"structure: {'OK' if self.checks.ok else 'BAD'} ({checked} checked against the ledgers)", False))
        if self.checks.ok:
            return Downloaded(tuple(lines), None, self)
        lines += [(f"  {printable(p.path)}: {p.kind.value}: {printable(p.message)}", True)
                  for p in self.checks.problems]
        return Downloaded(tuple(lines), VerificationFailedError(
            f"{plural(len(self.checks.problems), 'problem')} found in the copy at {report.dest}",
            problems=list(self.checks.problems)), self)


def download_cache(source: Source, *, subsets: Sequence[str] | None, dest: str | os.PathLike,
                   mirrors: Sequence[str] = (), workers: int = 8, dry_run: bool = False,
                   policy: RetryPolicy = DOWNLOAD_POLICY, progress: bool | None = None,
                   part_bytes: int = PART_BYTES, **store_options) -> CacheDownload:
    """Download the chosen cells of the unpinned cache or store ``source`` (`detect`) into ``dest``.

    Args:
        subsets: cell names or globs (every cell when None or empty); a single cache takes none.
        dest: the local folder (a store of the chosen cells, or the cache itself); re-running resumes.
        mirrors: copies of the same tree (URLs or paths) tried in turn when one fails a file.
        **store_options: for every mirror, as `open_store` takes them (the source is already open).

    Raises:
        UnknownSubsetError: a pattern matches no cell, or ``subsets`` given for a single cache.
        UnsafePathError: the listing names a file outside its cell, a name marin writes, one file twice, or a
            file where it names a folder too.
        CacheUnfinishedError, CacheFormatError: a chosen cell is unfinished or unreadable: nothing fetched.
        RemoteError: the source cannot be read or listed.
        CorpusLockedError: another process is writing ``dest``.
    """
    store = source.store
    if source.kind == CACHE:
        if subsets:
            raise UnknownSubsetError("--subset selects cells of a store; this is one cache", actual=list(subsets))
        cells = [""]
    else:
        cells = select_subsets(source.cells, list(subsets or []), what="cell")
    with ThreadPoolExecutor(max_workers=max(1, min(REMOTE_WORKERS, len(cells)))) as pool:
        caches = list(pool.map(lambda c: open_cache(store, c), cells))  # refuses what is unfinished or unreadable
    listed = [(o, cell) for cell in cells for o in cell_listing(store, cell)]
    with ThreadPoolExecutor(max_workers=REMOTE_WORKERS) as pool:  # a HEAD each where a listing names checksums
        vouched = list(pool.map(lambda oc: store.vouched(oc[0]), listed))
    files = tuple(FileTask(o.path, o.size, o.sha256, cell, tuple(sorted(dict(o.checksums).items())))
                  for o, (_, cell) in zip(vouched, listed))
    _refuse_files_over_folders(files, store.url)
    plan = DownloadPlan(source=store.url, manifest_sha256="", subsets=tuple(c for c in cells if c), files=files,
                        tokens=sum(c.tokens for c in caches))
    root = Path(dest)
    if dry_run:
        return CacheDownload(DownloadReport(plan=plan, dest=str(root), dry_run=True), None)
    stores = StoreOrder([store, *(open_store(m, **store_options) for m in mirrors)])
    with corpus_lock(root):
        report = fetch_all(plan, root, stores, workers=workers, policy=policy, progress=progress,
                           part_bytes=part_bytes)
        checked = _record(root, store.url, plan, report)
    if not report.ok:
        return CacheDownload(report, None, checked)
    return CacheDownload(report, verify_source(root, subsets=list(plan.subsets) or None, progress=False), checked)


def _record(root: Path, source: str, plan: DownloadPlan, report: DownloadReport) -> dict[str, Checked]:
    """Record what each file in place was checked against (`write_checked`), beside the earlier runs' entries
    for the cells this one did not fetch; return this run's entries. A file kept from an earlier run at its
    listed size, that no digest was checked for now, keeps its earlier entry (else it is hashed here)."""
    failed = {p for p, _ in report.failed}
    earlier = (read_checked(root) or ("", {}))[1]
    entries = {}
    for task in plan.files:
        if task.path in failed:
            continue
        sha = report.sha256.get(task.path)
        before = earlier.get(task.path)
        if sha is None and before is not None and before.bytes == task.bytes and not task.expected():
            entries[task.path] = before
            continue
        entries[task.path] = checked_entry(task.bytes, sha or sha256_file(root / task.path)[0], task.expected())
    fetched_cells = tuple(f"{c}/" for c in plan.subsets)
    write_checked(root, source, entries, keep=[p for p in earlier if fetched_cells and not p.startswith(fetched_cells)])
    return entries


def cell_listing(store: Store, cell: str) -> Iterator[ObjectInfo]:
    """The files of ``cell`` ("" for a single cache) as ``store`` lists them, each name checked before it
    becomes a local path: a clean relative path inside the cell, no name marin keeps beside a copy (its lock,
    a partial file: `is_reserved`), and listed once. A listing is the server's word, like a manifest."""
    seen: set[str] = set()
    where = store.describe(cell)
    for o in (o for o in store.list(cell) if not foreign(o.path)):  # other tools' bookkeeping is no cell's
        path = safe_relpath(o.path, where=where)
        if cell and not path.startswith(f"{cell}/"):
            raise UnsafePathError(f"the listing names {shown(path)}, outside the cell", path=where, actual=path)
        if is_reserved(path) or path in seen:
            why = "a name marin writes beside a copy" if path not in seen else "listed twice"
            raise UnsafePathError(f"the listing names {shown(path)}: {why}", path=where, actual=path)
        seen.add(path)
        yield o


def _refuse_files_over_folders(files: Sequence[FileTask], where: str) -> None:
    """A listing naming ``a/b`` as a file and ``a/b/c`` too (S3 keys are flat; no disk holds both) is refused
    before anything is written: fetched, one of them would fail only halfway, blaming the destination."""
    folders = {str(p) for task in files for p in PurePosixPath(task.path).parents}
    clash = next((task.path for task in files if task.path in folders), None)
    if clash is not None:
        inside = next(task.path for task in files if task.path.startswith(f"{clash}/"))
        raise UnsafePathError(f"the listing names {shown(clash)} as a file and as the folder of {shown(inside)}",
                              path=where, actual=clash)
