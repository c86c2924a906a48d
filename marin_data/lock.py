"""The corpus write lock: one writer per corpus directory at a time.

``.marin.lock`` at the corpus root, held with an OS file lock (`filelock`), so a killed writer never leaves
it stuck: the kernel releases the lock with the process. The file itself stays (``verify`` ignores it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from marin_data.errors import CorpusLockedError
from marin_data.layout import LOCK_NAME

__all__ = ["corpus_lock"]



@contextlib.contextmanager
def corpus_lock(root: str | os.PathLike) -> Iterator[None]:
    """Hold the write lock of the corpus at ``root`` (created if needed) or raise `CorpusLockedError`."""
    from filelock import FileLock, Timeout

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout as e:
        raise CorpusLockedError("another marin-data process is writing this corpus", path=str(root)) from e
    try:
        yield
    finally:
        lock.release()
