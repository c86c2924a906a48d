"""One file of a store hashed where it lives: the job an ``adopt`` of a store sends to its engine.

A `FileJob` is plain data (the store's URL and options, the file as the listing gave it, what its row of
the shard index says beyond its bytes), so that it pickles to a Ray task as well as it runs on a thread.
`hash_file` opens the store (once per process: `job_store`), asks for every digest the store vouches for
(`Store.vouched`: S3's ``ChecksumSHA256``/``CRC32C`` from one HEAD, a plain-MD5 ETag, GCS's ``x-goog-hash``, the
Hub's LFS SHA-256). A file the structural checks read whole comes with the digests of the bytes they read
(``checked``, `marin_data.levanter.adopt_reads`): compared with the store's, they are its row, and it is not
read again (where they disagree, it is read as any other). Else it reads a data chunk file's index (unless the
checks' read of it came with the job: ``tail``), then streams the file once in `READ_CHUNK` pieces through
`marin_data.levanter.filehash.hash_stream` (SHA-256 and the store's own algorithms; a data chunk file's
frames decoded and their token ids checked as they pass). Bytes that contradict a digest the store gives
are refused (`StoreDigestMismatchError`) after the retries a damaged transfer deserves; a transient failure
restarts the file from its start. Memory is one piece and one frame per job, whatever the file's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from marin_data.corpus.records import ShardRecord
from marin_data.errors import StoreDigestMismatchError
from marin_data.levanter.adopt_journal import Finished
from marin_data.levanter.filehash import ChunkCheck, Hashed, hash_stream
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores.base import ObjectInfo, Store
from marin_data.stores.checksums import mismatch
from marin_data.transfer.plan import DOWNLOAD_POLICY
from marin_data.transfer.read import read_tail
from marin_data.transfer.rehash import job_store

__all__ = ["FileJob", "hash_file", "identity"]



@dataclass(frozen=True)
class FileJob:
    """Hash ``info.path`` of the store at ``url`` (opened with ``options``) into a row of ``subset``."""

    url: str
    options: tuple[tuple[str, Any], ...]
    info: ObjectInfo  # as the one listing gave it
    subset: str
    kind: str
    tokens: int = 0
    docs: int = 0
    chunk: ChunkCheck | None = None  # a data chunk file: decoded and checked as it streams
    policy: RetryPolicy = DOWNLOAD_POLICY
    checked: dict[str, str] | None = None  # the digests of its bytes as the structural checks read them whole
    tail: bytes = b""  # a data chunk file's index as the structural checks read it


def identity(info: ObjectInfo) -> dict[str, object]:
    """What a listing says of a file without reading it: its size and the digests it lists. An entry made when
    the listing said the same is still the file's."""
    return {"bytes": info.size, **info.digests(), **({"git_sha1": info.git_sha1} if info.git_sha1 else {})}


def hash_file(job: FileJob) -> Finished:
    """The row of ``job``'s file, the store's digests it was checked against, and its listing's identity.

    Raises:
        StoreDigestMismatchError: the bytes read contradict a digest the store gives for them (past retries).
        CacheFormatError, CacheCheckError: a data chunk file's index or frames are bad, a token id lies outside
            the vocabulary, or the file changed while it was read (another size than listed).
        RemoteError: the store failed past its retries.
    """
    store = job_store(job.url, job.options)
    where = store.describe(job.info.path)
    info = retry_call(lambda: store.vouched(job.info), policy=job.policy, what=where)
    expected = info.digests()
    if job.checked is not None and mismatch(expected, job.checked) is None:
        hashed = Hashed(job.checked, job.info.size, 0)  # the bytes the checks read: not fetched again
    else:
        hashed = retry_call(lambda: _read(store, job, expected), policy=job.policy, what=where)
    row = ShardRecord(path=job.info.path, subset=job.subset, bytes=hashed.size, sha256=hashed.digests["sha256"],
                      docs=job.docs, tokens=job.tokens, row_groups=hashed.row_groups, kind=job.kind)
    return Finished(row, expected, identity(job.info))


def _read(store: Store, job: FileJob, expected: dict[str, str]) -> Hashed:
    """One attempt: the index (a data chunk file), then the file streamed once and checked."""
    path, size, where = job.info.path, job.info.size, store.describe(job.info.path)
    tail = job.tail or (read_tail(store, path, size, job.chunk.meta.index_bytes) if job.chunk else b"")
    with store.read(path) as stream:
        hashed = hash_stream(_at_most(stream, size + 1), size=size, where=where, also=set(expected) - {"sha256"},
                             chunk=job.chunk, tail=tail)
    bad = mismatch(expected, hashed.digests)
    if bad is not None:
        raise StoreDigestMismatchError(
            f"{bad} {hashed.digests[bad]} of the bytes read, {expected[bad]} the store gives for them: nothing "
            "pinned", path=where, expected=expected[bad], actual=hashed.digests[bad])
    return hashed


def _at_most(pieces, limit: int) -> Iterator[bytes]:
    """``pieces`` up to ``limit`` bytes: one byte past a file's listed size shows it is longer, and a body
    without end is read no further."""
    left = limit
    for piece in pieces:
        yield piece[:left]
        left -= min(left, len(piece))
        if not left:
            return
