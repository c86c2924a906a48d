"""Reading small files whole through a `marin_data.stores` store (a cache's ledgers and ``zarr.json``, a
corpus's metadata): every read bounded before it is buffered, retried as downloads are (`DOWNLOAD_POLICY`),
a missing file told apart from a failing one."""

from __future__ import annotations

from marin_data.errors import CacheFormatError, RemoteError
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores.base import Store
from marin_data.transfer.plan import DOWNLOAD_POLICY

__all__ = ["read_file", "read_tail", "join"]


def join(prefix: str, name: str) -> str:
    """``prefix/name`` for store paths, ``name`` at the root."""
    return f"{prefix.rstrip('/')}/{name}" if prefix else name


def read_file(store: Store, path: str, *, limit: int, policy: RetryPolicy = DOWNLOAD_POLICY) -> bytes | None:
    """The whole of ``path``, or None when it does not exist (retried as ``policy`` says).

    Raises:
        CacheFormatError: it is larger than ``limit`` (refused as it arrives, never buffered).
        RemoteError: the store failed past its retries.
    """
    def get() -> bytes:
        pieces, size = [], 0  # joined once at the end: a growing buffer would copy a chunk file twice
        with store.read(path) as stream:
            for piece in stream:
                pieces.append(piece)
                size += len(piece)
                if size > limit:
                    raise CacheFormatError(f"larger than the {limit} bytes such a file may have",
                                           path=store.describe(path), expected=limit)
        return b"".join(pieces)

    try:
        return retry_call(get, policy=policy, what=store.describe(path))
    except RemoteError as e:
        if getattr(e, "status", None) == 404:
            return None
        raise


def read_tail(store: Store, path: str, size: int, n: int) -> bytes:
    """The last ``n`` bytes of ``path``, whose size is ``size``, in one ranged read."""
    start = max(0, size - n)

    def get() -> bytes:
        with store.read(path, start, size) as stream:
            skip = start - stream.start  # a server that ignores Range answers with the whole object
            out = bytearray()
            for piece in stream:
                out += piece
                if len(out) > skip + n:
                    break
            return bytes(out[skip:skip + n])

    return retry_call(get, policy=DOWNLOAD_POLICY, what=store.describe(path))
