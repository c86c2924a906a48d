"""Atomic file writes and streaming hashes: a crash never leaves wrong bytes under a final name.

A file is written to a unique ``<name>.<uuid8>.part`` beside its target, fsynced, then ``os.replace``d
into place; the temporary file is removed whatever happens (as huggingface_hub's
``_download_to_tmp_and_move``). Readers therefore see either the old file, the new one, or nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["atomic_path", "atomic_write_bytes", "sha256_file", "pieces", "HASH_CHUNK", "WRITE_BYTES"]

HASH_CHUNK = 8 << 20  # 8 MiB reads: bounded memory whatever the file size, large enough for ~1 GB/s
# The largest single write of downloaded bytes (`pieces`, used by `marin_data.transfer.partial`). On the VM this was
# measured on, page-cache writes of 512 KiB or more at times cost 1.2-2.2 s of kernel time per GiB against
# 0.25 s in 128 KiB writes (docs/benchmarks.md; likely Linux 6.x's large folios), and a write call
# costs ~2 us: 128 KiB is cheap everywhere.
WRITE_BYTES = 128 << 10


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success fsync it and rename it onto ``target``.

    The caller writes (and closes) the temporary file inside the ``with`` block. If the block raises,
    the target is left untouched and the temporary file is deleted.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def sha256_file(
    path: str | os.PathLike, chunk: int = HASH_CHUNK, *, on_bytes: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """Return ``(hex sha256, size in bytes)`` of a file, reading it in bounded chunks.

    hashlib releases the GIL on large buffers, so threads hashing different files run in parallel.
    ``on_bytes(n)`` is called after each chunk, so a progress bar moves while a 2 GiB shard is hashed.
    """
    h = hashlib.sha256()
    size = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
            if on_bytes is not None:
                on_bytes(n)
    return h.hexdigest(), size


def pieces(data) -> Iterator[tuple[int, memoryview]]:
    """``(offset, view)`` of consecutive `WRITE_BYTES` slices of a bytes-like ``data``: write bulk data in these."""
    view = memoryview(data).cast("B")
    for at in range(0, len(view), WRITE_BYTES):
        yield at, view[at : at + WRITE_BYTES]


def _fsync_dir(path: Path) -> None:
    """Persist a rename: fsync the directory that holds it (a no-op where directories can't be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
