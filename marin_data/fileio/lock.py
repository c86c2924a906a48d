"""The corpus write lock: one writer per corpus directory at a time.

``.marin.lock`` at the corpus root, held with an OS file lock (``flock``, as `filelock` takes it), so a
killed writer never leaves it stuck: the kernel releases the lock with the process. The holder removes the
file when it is done (a killed writer leaves it behind, empty and unlocked; ``verify`` ignores it). Removing a
lock file races with a writer that opened it just before: that writer then holds a lock on a file no longer
there, so after locking it checks that the name still leads to the file it locked, and starts again if not.
It is opened through `marin_data.fileio.atomic.SafeDir`: a link or a folder in its place is refused, never followed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from marin_data.fileio.atomic import SafeDir
from marin_data.errors import CorpusLockedError
from marin_data.layout import LOCK_NAME

__all__ = ["corpus_lock"]


@contextlib.contextmanager
def corpus_lock(root: str | os.PathLike) -> Iterator[None]:
    """Hold the write lock of the corpus at ``root`` (created if needed) or raise `CorpusLockedError`."""
    root = Path(root)
    with SafeDir(root) as folder:
        fd = _take(folder, root)
        try:
            yield
        finally:
            folder.unlink(LOCK_NAME)  # still held: nobody else can have taken this file meanwhile
            os.close(fd)  # releases the lock


def _take(folder: SafeDir, root: Path) -> int:
    """Lock ``LOCK_NAME`` in ``folder`` and return its descriptor, once the name leads to the file locked."""
    while True:
        fd = folder.open(LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            raise CorpusLockedError("another marin-data process is writing this corpus", path=str(root)) from e
        now, mine = folder.lstat(LOCK_NAME), os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)  # the holder removed it between our open and our lock: lock the file there now
