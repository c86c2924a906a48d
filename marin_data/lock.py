"""The corpus write lock: one writer per corpus directory at a time.

``.marin.lock`` at the corpus root, held with an OS file lock (``flock``, as `filelock` takes it), so a
killed writer never leaves it stuck: the kernel releases the lock with the process. The file itself stays
(``verify`` ignores it). It is opened through `marin_data.atomic.SafeDir`: a link or a folder in its place
is refused, never followed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from marin_data.atomic import SafeDir
from marin_data.errors import CorpusLockedError
from marin_data.layout import LOCK_NAME

__all__ = ["corpus_lock"]


@contextlib.contextmanager
def corpus_lock(root: str | os.PathLike) -> Iterator[None]:
    """Hold the write lock of the corpus at ``root`` (created if needed) or raise `CorpusLockedError`."""
    root = Path(root)
    with SafeDir(root) as folder:
        fd = folder.open(LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise CorpusLockedError("another marin-data process is writing this corpus", path=str(root)) from e
        yield
    finally:
        os.close(fd)  # releases the lock
