"""Partial files: how a file's bytes land on disk while `marin_data.transfer.download` fetches them, resumably.

A file is fetched into ``<name>`` + `PARTIAL_SUFFIX` beside its final name — a fixed name, so a re-run
after a crash (even ``kill -9``) finds it — and renamed into place only once its size and SHA-256 match.
The suffix ends in ``.part``, which ``verify`` reports as a leftover partial file, not as corruption.
Two kinds, chosen by `open_partial`:

- `StreamPartial`: one GET streams the file from its start (or, resuming, from the end of what is there
  with ``Range: bytes=N-``); the partial file is always a prefix, hashed as it grows.
- `RangedPartial`: a big file fetched as parallel byte ranges into a partial of full size, with a record
  (`RANGES_SUFFIX`) of the bytes each range holds, so every range resumes on its own.

The one-GET fetch loop lives in `Prefix`, which `StreamPartial` shares with the loader's in-memory copy
(`marin_data.transfer.body`). Both kinds start writing back to disk as they go (`_start_writeback`), so the
fsync before the rename finds little left to do. Both open, rename and remove their files inside a
`marin_data.fileio.atomic.SafeDir`, so a link in the destination is refused, never written through; and both
refuse to start a file the free space cannot hold (`InsufficientSpaceError`).
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from marin_data.fileio.atomic import HASH_CHUNK, SafeDir, space_errors, write_all
from marin_data.errors import InsufficientSpaceError, RetryableRemoteError, ShardChecksumError
from marin_data.layout import PARTIAL_SUFFIX, RANGES_SUFFIX
from marin_data.stores.base import Store
from marin_data.stores.checksums import Hasher
from marin_data.transfer.plan import FileTask
from marin_data.fileio.untrusted_json import loads

__all__ = ["Meter", "Prefix", "StreamPartial", "RangedPartial", "hasher", "open_partial", "partial_path",
           "ranges_path", "resumed_bytes"]

WRITEBACK_CHUNK = 32 << 20  # bytes written between two `_start_writeback` calls
RECORD_EVERY = 8 << 20  # bytes a range receives between two rewrites of its `RangedPartial` record
_RECORD_LIMIT = 1 << 20  # a longer ranges record is damaged (or hostile): it counts nothing


class Meter(Protocol):
    def got(self, n: int) -> None:
        """Count ``n`` bytes received (and raise to stop the transfer, e.g. on Ctrl-C)."""


def open_partial(folder: SafeDir, final: str, task: FileTask, *, ranges: int,
                 part_bytes: int) -> StreamPartial | RangedPartial:
    """The partial file for ``final`` in ``folder``: in up to ``ranges`` parallel ranges of at least
    ``part_bytes`` when the file holds two or more (or a partial in ranges is there already), else one
    stream."""
    name = final + PARTIAL_SUFFIX
    if folder.lstat(ranges_path(Path(name)).name) is not None or (ranges > 1 and task.bytes >= 2 * part_bytes):
        return RangedPartial(folder, name, task, max(part_bytes, -(-task.bytes // ranges), 1), ranges)
    return StreamPartial(folder, name, task)


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + PARTIAL_SUFFIX)


def ranges_path(partial: Path) -> Path:
    return partial.with_name(partial.name.removesuffix(PARTIAL_SUFFIX) + RANGES_SUFFIX)


def resumed_bytes(partial: Path) -> int:
    """Bytes a partial file already holds: its size, or for one fetched in ranges what its record says (read
    without following a link, and bounded: only for the progress bar)."""
    try:
        fd = os.open(ranges_path(partial), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            return sum(loads(f.read(_RECORD_LIMIT))["done"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        return partial.lstat().st_size
    except FileNotFoundError:
        return 0


class Prefix:
    """A copy of ``task``'s file that grows from its start, hashed as it grows (``hash``, ``offset``): a
    `StreamPartial` on disk, or `marin_data.transfer.body.MemoryPartial` in memory. Subclasses give ``reset``
    (start again from byte 0) and ``write`` (append a chunk, cut at the listed size)."""

    task: FileTask
    hash: Hasher
    offset: int

    def reset(self) -> None:
        raise NotImplementedError

    def write(self, chunk: bytes) -> None:
        raise NotImplementedError

    def fetch(self, store: Store, meter: Meter) -> None:
        """One request: continue the copy from its offset to the end, then check it."""
        task = self.task
        if self.offset < task.bytes:
            # No trust in a response's sizes: a truncating hop may rewrite Content-Length. A body that runs
            # past the listed size is cut there (the connection dropped), a short one resumes, and the digest
            # settles the rest.
            with store.read(task.path, start=self.offset) as stream:
                if stream.start != self.offset:  # a 200 to our Range: the body starts at byte 0
                    if stream.start != 0:
                        raise RetryableRemoteError(f"asked for bytes from {self.offset}, got from {stream.start}",
                                                   path=store.describe(task.path))
                    self.reset()
                for chunk in stream:
                    self.write(chunk)
                    meter.got(len(chunk))
                    if self.offset >= task.bytes:
                        break
            if self.offset < task.bytes:
                raise RetryableRemoteError(f"truncated body: {self.offset} of {task.bytes} bytes",
                                           path=store.describe(task.path))
        self.check()

    def check(self) -> None:
        """Raise (and discard the bytes) unless the copy is exactly the listed file; keep its
        digests (``digests``) when it is."""
        digests = self.hash.hexdigests()
        wrong = self.task.mismatch(digests) if self.offset == self.task.bytes else "sha256"
        if wrong is not None:
            self.reset()
            raise _mismatch(self.task, digests, wrong)
        self.digests = digests


class StreamPartial(Prefix):
    """The partial file of one download and the SHA-256 of the bytes in it, kept in step."""

    def __init__(self, folder: SafeDir, name: str, task: FileTask):
        self.folder, self.name, self.path, self.task = folder, name, folder.path / name, task
        self.f = open(folder.open(name, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644), "ab+", buffering=0)
        try:
            size = os.fstat(self.f.fileno()).st_size
            _check_space(self.f.fileno(), task.bytes - min(size, task.bytes), self.path)
        except BaseException:
            self.f.close()
            raise
        if size > task.bytes:
            self.reset()
        else:
            self.hash = _hash_prefix(self.f.fileno(), size, task)
            self.offset = size
        self.flushed = self.offset

    def reset(self) -> None:
        self.f.truncate(0)
        self.f.seek(0)
        self.hash, self.offset, self.flushed = hasher(self.task), 0, 0

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``, cut at the listed size: the bytes past it are not the file's."""
        chunk = chunk[:self.task.bytes - self.offset]
        _write(self.f.fileno(), chunk, None)
        self.hash.update(chunk)
        self.offset += len(chunk)
        if self.offset - self.flushed >= WRITEBACK_CHUNK:
            _start_writeback(self.f.fileno(), self.flushed, self.offset - self.flushed)
            self.flushed = self.offset

    def commit(self, final: str) -> None:
        """Move the verified bytes to their final name in the folder (fsync, rename, fsync the folder)."""
        self.f.close()
        self.folder.replace(self.name, final)

    def close(self) -> None:
        self.f.close()

class RangedPartial:
    """A file fetched as parallel byte ranges into its partial file, hashed in file order as ranges complete.

    The partial file has the file's full size from the start and each range lands at its offset. Beside it,
    a record (`RANGES_SUFFIX`, JSON) keeps the range bounds and the bytes done in each, rewritten as they
    grow, so a re-run — after a failure, Ctrl-C or ``kill -9`` — continues every range where it stopped. A
    partial file without a record is the prefix a one-GET download left: its bytes count as done. Whichever
    thread completes the range at the hash cursor hashes it (and any complete ones after it), reading the
    bytes back while they are still in the page cache. Nothing is trusted until the whole digest matches;
    a wrong one discards every range.
    """

    def __init__(self, folder: SafeDir, name: str, task: FileTask, part_bytes: int, parallel: int):
        self.folder, self.name, self.path, self.task, self.parallel = folder, name, folder.path / name, task, parallel
        self.record = ranges_path(self.path)
        self.lock, self.hash_lock = threading.Lock(), threading.Lock()
        self.fd = folder.open(name, os.O_RDWR | os.O_CREAT, 0o644)
        self.bounds = list(range(0, task.bytes, part_bytes)) + [task.bytes]
        try:
            self.done = self._load()
            _check_space(self.fd, task.bytes - os.fstat(self.fd).st_size, self.path)
            _space_errors(os.ftruncate, self.fd, task.bytes, path=self.path)
        except BaseException:
            self.close()
            raise
        self._restart_hash()
        self._save()

    def _load(self) -> list[int]:
        """Bytes done per range: from the record, or from a one-GET prefix; zeros for anything else."""
        try:
            fd = self.folder.open(self.record.name, os.O_RDONLY)
            with open(fd, "rb") as f:
                record = loads(f.read(_RECORD_LIMIT))
        except FileNotFoundError:
            size = os.fstat(self.fd).st_size
            prefix = size if size <= self.task.bytes else 0
            return [min(max(prefix - lo, 0), hi - lo) for lo, hi in zip(self.bounds, self.bounds[1:])]
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict) and _valid_record(record, self.task):
            self.bounds = record["bounds"]
            return record["done"]
        return [0] * (len(self.bounds) - 1)  # a record of another file, or damaged: nothing counts

    def _save(self) -> None:
        with self.lock:
            data = json.dumps({"sha256": self.task.sha256, "bytes": self.task.bytes, "bounds": self.bounds,
                               "done": self.done}).encode()
            tmp = self._record_tmp()
            # No fsync: a lost record only costs a re-fetch, the digest guards the bytes.
            self.folder.write_bytes(tmp, data)
            self.folder.regular(self.record.name)
            os.replace(tmp, self.record.name, src_dir_fd=self.folder.fd, dst_dir_fd=self.folder.fd)

    def _record_tmp(self) -> str:
        return self.record.name.removesuffix(".part") + ".tmp.part"  # a leftover to `verify`

    def _restart_hash(self) -> None:
        self.hash, self.cursor = hasher(self.task), 0

    def _complete(self, i: int) -> bool:
        return self.done[i] == self.bounds[i + 1] - self.bounds[i]

    def fetch(self, store: Store, meter: Meter) -> None:
        """Fetch every unfinished range in parallel, then check the digest. Raises the first range's error
        once all have stopped (each keeps what it received)."""
        todo = [i for i in range(len(self.done)) if not self._complete(i)]
        if todo:
            with ThreadPoolExecutor(max_workers=min(self.parallel, len(todo)),
                                    thread_name_prefix="download-range") as pool:
                futures = [pool.submit(self._fetch_range, store, i, meter) for i in todo]
            for future in futures:
                future.result()
        self._advance()
        digests = self.hash.hexdigests() if self.cursor == len(self.done) else {"sha256": "incomplete"}
        wrong = self.task.mismatch(digests) if self.cursor == len(self.done) else "sha256"
        if wrong is not None:
            self.done = [0] * len(self.done)
            self._restart_hash()
            self._save()
            raise _mismatch(self.task, digests, wrong)
        self.digests = digests

    def _fetch_range(self, store: Store, i: int, meter: Meter) -> None:
        lo, hi = self.bounds[i] + self.done[i], self.bounds[i + 1]
        saved = lo
        try:
            with store.read(self.task.path, start=lo, end=hi) as stream:
                at = stream.start  # 0 when the server ignored Range: bytes before `lo` are skipped
                if at > lo:
                    raise RetryableRemoteError(f"asked for bytes from {lo}, got from {at}",
                                               path=store.describe(self.task.path))
                for chunk in stream:
                    meter.got(len(chunk))
                    if at + len(chunk) > lo:
                        piece = memoryview(chunk)[lo - at : hi - at]
                        _write(self.fd, piece, lo)
                        lo += len(piece)
                        self.done[i] = lo - self.bounds[i]
                        if lo - saved >= RECORD_EVERY:
                            self._save()
                            saved = lo
                    at += len(chunk)
                    if lo >= hi:
                        break  # a body running past the range (a 200) is cut here; the connection is dropped
        finally:
            self._save()
        if lo < hi:
            raise RetryableRemoteError(f"truncated range: {lo - self.bounds[i]} of {hi - self.bounds[i]} bytes "
                                       f"from byte {self.bounds[i]}", path=store.describe(self.task.path))
        self._advance()

    def _advance(self) -> None:
        """Hash the complete ranges at the cursor, in file order, and start writing them back to disk."""
        with self.hash_lock:
            while self.cursor < len(self.done) and self._complete(self.cursor):
                lo, hi = self.bounds[self.cursor], self.bounds[self.cursor + 1]
                at = lo
                while at < hi:
                    data = os.pread(self.fd, min(hi - at, HASH_CHUNK), at)
                    if not data:
                        break  # the file was shortened under us: the digest will not match
                    self.hash.update(data)
                    at += len(data)
                _start_writeback(self.fd, lo, hi - lo)
                self.cursor += 1

    def commit(self, final: str) -> None:
        """Move the verified bytes to their final name; the record goes first (a partial left without it is
        a complete prefix, which a re-run verifies)."""
        self.close()
        self.folder.unlink(self._record_tmp())
        self.folder.unlink(self.record.name)
        self.folder.replace(self.name, final)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def hasher(task: FileTask) -> Hasher:
    """The SHA-256, and every other digest the store vouches for, of the bytes fetched for ``task``."""
    return Hasher(a for a, _ in task.checksums)


def _mismatch(task: FileTask, digests: dict[str, str], wrong: str) -> ShardChecksumError:
    """The error of a fetched file that is not the listed one (its bytes are discarded): its SHA-256 (or size,
    when no digest is listed), or the ``wrong`` digest the store vouches for, differs."""
    digest, want = digests.get(wrong, "incomplete"), task.expected().get(wrong)
    if wrong != "sha256" and want is not None:
        return ShardChecksumError(f"{wrong} {digest} differs from the {wrong} {want} the store vouches for; "
                                  "discarded", path=task.path, expected=want, actual=digest)
    listed = f"{task.sha256[:12]}…" if task.sha256 else f"of {task.bytes} bytes (no digest listed)"
    return ShardChecksumError(f"sha256 {digest[:12]}… differs from the listed {listed}; discarded", path=task.path,
                              expected=task.sha256, actual=digest)


def _valid_record(record: dict, task: FileTask) -> bool:
    """Whether a ranges record describes ``task``'s file: ascending bounds from 0 to its size, and per range
    a count of bytes done that fits the range."""
    bounds, done = record.get("bounds"), record.get("done")
    if (record.get("sha256"), record.get("bytes")) != (task.sha256, task.bytes):
        return False
    if not (isinstance(bounds, list) and isinstance(done, list) and len(done) == len(bounds) - 1):
        return False
    if not all(isinstance(x, int) for x in (*bounds, *done)) or bounds[:1] != [0] or bounds[-1] != task.bytes:
        return False
    return all(lo < hi and 0 <= d <= hi - lo for d, lo, hi in zip(done, bounds, bounds[1:]))


def _write(fd: int, data, offset: int | None) -> None:
    """Write all of ``data`` at ``offset`` (None: at the file position); a full disk is `InsufficientSpaceError`."""
    _space_errors(write_all, fd, data, offset)


def _check_space(fd: int, need: int, path: Path) -> None:
    """Refuse to start a file the free space cannot hold: preallocating it would leave a huge sparse file,
    streaming it would fill the disk."""
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    if need > free:
        raise InsufficientSpaceError(f"needs {need:,} more bytes, {free:,} are free", path=str(path),
                                     expected=need, actual=free)


def _space_errors(call, *args, path: Path | None = None):
    """``call(*args)``, with a full disk, a quota or a file too large for the file system raised as
    `InsufficientSpaceError`."""
    with space_errors(path):
        return call(*args)


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing these bytes to disk now, without waiting.

    The final fsync (`atomic_path`) would otherwise find the whole file dirty in the page cache (Linux
    starts background writeback only at ~10% of RAM) and wait for all of it after the last byte arrived:
    ~0.3 s per GB on a fast disk, serialised at the end. On Linux ``POSIX_FADV_DONTNEED`` starts
    asynchronous writeback of dirty pages and drops only pages already clean, so the fsync finds little
    left to do. Elsewhere it is at worst a cache hint.
    """
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _hash_prefix(fd: int, size: int, task: FileTask) -> Hasher:
    h = hasher(task)
    at = 0
    while at < size and (chunk := os.pread(fd, min(size - at, HASH_CHUNK), at)):
        h.update(chunk)
        at += len(chunk)
    return h
