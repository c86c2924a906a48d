"""What the structural checks of an ``adopt`` of a store read, kept for its hashing jobs, so that neither a
metadata file nor a data chunk file's index is fetched again for them.

`CheckedReads` is the run's listing (`marin_data.stores.snapshot.SnapshotStore`) as the checks read it:
- a whole read of a file (a ledger, a ``zarr.json``, an offsets chunk file) is hashed as its pieces pass to
  the check, SHA-256 and every algorithm a store may vouch with (`STRENGTH`); once all of it was read,
  `digests` gives them: the digests of the very bytes checked. A file read twice (an offsets chunk file: by
  the checks, then to count each data chunk file's documents) must give the same bytes both times, else it
  has none and its job reads it again;
- a ranged read that ends at the file's end (a data chunk file's index, read by the checks) is kept (`tail`):
  its job decodes the file's frames with it and compares it with the file's last bytes.
The job still asks the store for its digests and compares them (`marin_data.levanter.adopt_files`). A read
stopped early or cut by a failure records nothing; its job then reads the file as before. It writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from marin_data.errors import RemoteError
from marin_data.stores.base import ObjectInfo, ReadStream, Store
from marin_data.stores.checksums import STRENGTH, Hasher

__all__ = ["CheckedReads"]

_DISAGREE = {}  # `digests` of a file whose reads gave other bytes


class CheckedReads(Store):
    """``store`` whose whole reads are hashed and whose reads of a file's end are kept (module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store, self.url = store, store.url
        self._lock = threading.Lock()
        self._digests: dict[str, dict[str, str]] = {}
        self._tails: dict[str, tuple[int, bytes]] = {}  # path -> (where the bytes start, the bytes)

    def digests(self, path: str) -> dict[str, str] | None:
        """The digests of ``path``'s bytes as the checks read them whole (every read alike), else None."""
        with self._lock:
            return self._digests.get(path) or None

    def tail(self, path: str, size: int, n: int) -> bytes:
        """The last ``n`` bytes of ``path`` (of ``size`` bytes) as the checks read them, else b"" (not read)."""
        with self._lock:
            start, data = self._tails.get(path, (-1, b""))
        return data if start == max(0, size - n) and start + len(data) == size else b""

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        stream = self.store.read(path, start, end)
        info = self.store.head(path)
        if info is None or not (start == 0 and end is None or end == info.size):
            return stream
        whole = start == 0 and end is None
        if not whole and stream.start != start:  # a server ignoring Range: the whole file, nothing kept
            return stream
        return ReadStream(self._watched(stream, path, info.size, whole), start=stream.start, close=stream.close)

    def _watched(self, stream: ReadStream, path: str, size: int, whole: bool) -> Iterator[bytes]:
        hasher, kept, n = Hasher(STRENGTH), bytearray(), 0
        for piece in stream:
            n += len(piece)
            if whole:
                hasher.update(piece)
            elif stream.start + n <= size:  # the stream ends where the range does
                kept += piece
            yield piece
        with self._lock:
            if whole and n == size:
                got = hasher.hexdigests()
                self._digests[path] = got if self._digests.get(path, got) == got else _DISAGREE
            elif not whole and stream.start + n == size:
                self._tails[path] = (stream.start, bytes(kept))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.store.list(prefix)

    def head(self, path: str) -> ObjectInfo | None:
        return self.store.head(path)

    def put(self, path: str, src: Path, *, sha256: str, size: int) -> None:
        raise RemoteError("the checks' reads of a store write nothing", path=self.describe(path))

    def vouched(self, info: ObjectInfo) -> ObjectInfo:
        return self.store.vouched(info)

    def describe(self, path: str) -> str:
        return self.store.describe(path)
