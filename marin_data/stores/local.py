"""A corpus in a local directory, seen as a store: the download source for a copy on disk or a mounted share."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from marin_data.fileio.atomic import atomic_path
from marin_data.fileio.untrusted_paths import safe_relpath
from marin_data.errors import RemoteError, RetryableRemoteError
from marin_data.stores.base import READ_CHUNK, ObjectInfo, ReadStream, Store
from marin_data.stores.limits import ListingBudget

__all__ = ["LocalStore"]


class LocalStore(Store):
    """Files under ``root``. It keeps no checksums, so ``head`` reports sizes only."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.url = str(self.root)

    def _file(self, path: str) -> Path:
        return self.root / safe_relpath(path, where=self.url)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        top = self._file(prefix) if prefix else self.root
        budget = ListingBudget(self.describe(prefix))  # a mounted share may hold more than any corpus
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            budget.take(entries=len(dirnames) + len(filenames), nbytes=sum(map(len, dirnames + filenames)))
            for name in sorted(filenames):
                p = Path(dirpath) / name
                yield ObjectInfo(p.relative_to(self.root).as_posix(), p.stat().st_size)

    def head(self, path: str) -> ObjectInfo | None:
        try:
            st = self._file(path).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(path, st.st_size)

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        try:
            f = open(self._file(path), "rb")
        except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
            raise RemoteError(f"cannot open: {e.strerror}", path=self.describe(path), status=404) from e
        except OSError as e:
            raise RetryableRemoteError(f"cannot open: {e}", path=self.describe(path)) from e
        f.seek(start)
        left = float("inf") if end is None else end - start

        def chunks() -> Iterator[bytes]:
            nonlocal left
            while left > 0 and (chunk := f.read(int(min(READ_CHUNK, left)))):
                left -= len(chunk)
                yield chunk

        return ReadStream(chunks(), start=start, close=f.close, stop=end)

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        with atomic_path(self._file(path)) as tmp, open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, READ_CHUNK)
