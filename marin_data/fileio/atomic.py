"""Atomic file writes and streaming hashes: a crash never leaves wrong bytes under a final name.

A file is written to a unique ``<name>.<uuid8>.part`` beside its target, fsynced, then ``os.replace``d
into place; the temporary file is removed whatever happens (as huggingface_hub's
``_download_to_tmp_and_move``). Readers therefore see either the old file, the new one, or nothing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from marin_data.errors import InsufficientSpaceError, MarinDataError, UnsafeDestinationError

__all__ = ["SafeDir", "atomic_path", "atomic_write_bytes", "sha256_file", "read_pieces", "pieces", "space_errors", "write_all",
           "HASH_CHUNK", "NO_SPACE", "WRITE_BYTES"]

HASH_CHUNK = 8 << 20  # 8 MiB reads: bounded memory whatever the file size, large enough for ~1 GB/s
# The largest single write of downloaded bytes (`pieces`, used by `marin_data.transfer.partial`). On the VM this was
# measured on, page-cache writes of 512 KiB or more at times cost 1.2-2.2 s of kernel time per GiB against
# 0.25 s in 128 KiB writes (docs/benchmarks.md; likely Linux 6.x's large folios), and a write call
# costs ~2 us: 128 KiB is cheap everywhere.
WRITE_BYTES = 128 << 10


class SafeDir:
    """A folder below a destination root, opened without following a symbolic link below that root.

    The root and its ancestors are the user's choice and may be links (a dangling one, or a file, where the
    root must be a folder is refused, naming it); every folder below it is opened with ``O_NOFOLLOW``
    relative to the one above (``openat``), so swapping a folder for a link midway redirects nothing, and a
    ``..`` part is refused, never walked. Files in it are opened, replaced and removed relative to the open
    folder, and a link or a file of the wrong kind where marin writes is refused (`UnsafeDestinationError`,
    naming the path), never followed, renamed or removed. Use it as a context manager, or `close` it.
    """

    def __init__(self, root: str | os.PathLike, rel: str | os.PathLike = "", *, create: bool = True) -> None:
        root = Path(root)
        if create:
            try:
                root.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError) as e:  # a dangling link or a file at or above root
                raise _in_the_way(root) from e
        self.path = root
        self.fd = _open_dir(None, os.fspath(root), root)
        try:
            for part in Path(rel).parts:
                if part in ("..", "/"):  # a caller's unchecked name: never walk out of the root
                    raise UnsafeDestinationError("leaves the destination folder: refusing to follow it",
                                                 path=str(root / rel), expected=f"a path below {root}")
                self.path = self.path / part
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=self.fd)
                fd = _open_dir(self.fd, part, self.path)
                os.close(self.fd)
                self.fd = fd
        except BaseException:
            os.close(self.fd)
            raise

    @classmethod
    def of(cls, target: str | os.PathLike, root: str | os.PathLike | None = None, *,
           create: bool = True) -> SafeDir:
        """The folder holding ``target``, walked from ``root`` (default: that folder itself)."""
        parent = Path(target).parent
        return cls(root if root is not None else parent,
                   parent.relative_to(root) if root is not None else "", create=create)

    def __enter__(self) -> SafeDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def proc_path(self, name: str) -> Path:
        """A path to ``name`` through the open folder (Linux's ``/proc/self/fd``), for code that wants a path:
        a folder swapped for a link after the walk does not redirect it."""
        if os.path.isdir(f"/proc/self/fd/{self.fd}"):
            return Path(f"/proc/self/fd/{self.fd}") / name
        return self.path / name

    def lstat(self, name: str) -> os.stat_result | None:
        """``name``'s own status (a link is not followed), or None when there is none."""
        try:
            return os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return None

    def regular(self, name: str) -> os.stat_result | None:
        """``name``'s status if it is a regular file, None if absent; `UnsafeDestinationError` otherwise."""
        st = self.lstat(name)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _unsafe(self.path / name, st)
        return st

    def open(self, name: str, flags: int, mode: int = 0o666) -> int:
        """``os.open`` of a regular file in this folder, never through a link."""
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError as e:
            st = self.lstat(name)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise _unsafe(self.path / name, st) from e
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device: never written to
            os.close(fd)
            raise _unsafe(self.path / name, st)
        return fd

    def replace(self, src: str, dst: str) -> None:
        """fsync ``src``, rename it onto ``dst`` (absent or a regular file) and persist the rename."""
        fd = self.open(src, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.regular(dst)
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        with contextlib.suppress(OSError):
            os.fsync(self.fd)

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def write_bytes(self, name: str, data) -> None:
        """Write ``data`` to ``name`` in place (no rename: for files a crash may leave half-written)."""
        fd = self.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)


def _open_dir(dir_fd: int | None, name: str, path: Path) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if dir_fd is not None else 0)
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except (NotADirectoryError, FileNotFoundError) as e:
        st = os.lstat(name, dir_fd=dir_fd) if isinstance(e, NotADirectoryError) else None
        if st is None:
            raise
        raise _unsafe(path, st, "a folder") from e


def _in_the_way(root: Path) -> UnsafeDestinationError:
    """Why ``root`` cannot be made a folder: the first of it and its ancestors that is not one."""
    for path in reversed((root, *root.parents)):
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) and not path.is_dir():
                target = "does not exist" if not path.exists() else "is not a folder"
                return UnsafeDestinationError(f"is a symbolic link to {os.readlink(path)}, which {target}: marin "
                                              "writes a folder there", path=str(path), expected="a folder",
                                              actual=f"a symbolic link to what {target}")
            if not path.is_dir():
                return _unsafe(path, st, "a folder")
    return UnsafeDestinationError("cannot be made a folder", path=str(root), expected="a folder")


def _unsafe(path: Path, st: os.stat_result, wanted: str = "a regular file") -> UnsafeDestinationError:
    kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
            else "a regular file" if stat.S_ISREG(st.st_mode) else "a special file")
    return UnsafeDestinationError(f"is {kind} where marin writes {wanted}: refusing to follow, replace or "
                                  "remove it", path=str(path), expected=wanted, actual=kind)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, root: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success fsync it and rename it onto ``target``.

    The caller writes (and closes) the temporary file inside the ``with`` block. If the block raises,
    the target is left untouched and the temporary file is deleted. Folders below ``root`` (the
    destination the user chose; default: ``target``'s folder) are created as needed and never followed
    when they are links (`SafeDir`), nor is ``target`` replaced when it is not a regular file.
    """
    with _atomic(target, root) as (folder, tmp, _):
        yield folder.proc_path(tmp)


def atomic_write_bytes(target: str | os.PathLike, data, *, root: str | os.PathLike | None = None) -> None:
    """Write ``data`` to ``target`` atomically (see `atomic_path` for ``root``)."""
    with _atomic(target, root) as (_, _, fd):
        write_all(fd, data)


@contextlib.contextmanager
def _atomic(target: str | os.PathLike, root: str | os.PathLike | None) -> Iterator[tuple[SafeDir, str, int]]:
    target = Path(target)
    with SafeDir.of(target, root) as folder, space_errors(target):
        folder.regular(target.name)  # refused before any work, not only at the rename
        tmp = f"{target.name}.{uuid.uuid4().hex[:8]}.part"
        fd = folder.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            yield folder, tmp, fd
            st = folder.lstat(tmp)
            if st is None or st.st_ino != os.fstat(fd).st_ino:
                raise UnsafeDestinationError("the temporary file was replaced while being written",
                                             path=str(folder.path / tmp))
            folder.replace(tmp, target.name)
        finally:
            os.close(fd)
            folder.unlink(tmp)


def sha256_file(
    path: str | os.PathLike | int, chunk: int = HASH_CHUNK, *, on_bytes: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """Return ``(hex sha256, size in bytes)`` of a file (a path, or an open descriptor, which it closes),
    reading it in bounded chunks.

    hashlib releases the GIL on large buffers, so threads hashing different files run in parallel.
    ``on_bytes(n)`` is called after each chunk, so a progress bar moves while a 2 GiB shard is hashed.
    """
    h = hashlib.sha256()
    size = 0
    for piece in read_pieces(path, chunk):
        h.update(piece)
        size += len(piece)
        if on_bytes is not None:
            on_bytes(len(piece))
    return h.hexdigest(), size


def read_pieces(path: str | os.PathLike | int, chunk: int = HASH_CHUNK) -> Iterator[memoryview]:
    """A file's bytes (a path, or an open descriptor, which it closes) in pieces of at most ``chunk`` bytes,
    read into one reused buffer: each piece is valid until the next one is read."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            yield view[:n]


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full file system, a quota, a file too large for it


@contextlib.contextmanager
def space_errors(path: str | os.PathLike | None) -> Iterator[None]:
    """Raise a full disk, a quota or a file too large for the file system met inside the block (pyarrow's
    writes too) as `InsufficientSpaceError` naming ``path``; a re-run resumes once there is room."""
    try:
        yield
    except OSError as e:
        if e.errno not in NO_SPACE or isinstance(e, MarinDataError):
            raise
        raise InsufficientSpaceError(e.strerror or str(e), path=None if path is None else str(path)) from e


def write_all(fd: int, data, offset: int | None = None) -> None:
    """Write every byte of ``data`` to ``fd`` at ``offset`` (None: at its position), in `pieces`. A write may
    take fewer bytes than it is given (a file system filling up, a file-size limit) and only the next one
    says why (ENOSPC, EFBIG): the rest is written again, so a file never ends short under its final name."""
    for at, piece in pieces(data):
        while piece:
            n = os.write(fd, piece) if offset is None else os.pwrite(fd, piece, offset + at)
            piece, at = piece[n:], at + n


def pieces(data) -> Iterator[tuple[int, memoryview]]:
    """``(offset, view)`` of consecutive `WRITE_BYTES` slices of a bytes-like ``data``: write bulk data in these."""
    view = memoryview(data).cast("B")
    for at in range(0, len(view), WRITE_BYTES):
        yield at, view[at : at + WRITE_BYTES]
