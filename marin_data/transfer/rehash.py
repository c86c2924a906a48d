"""Re-hashing what a store holds: every byte of a file streamed, its SHA-256 and size compared with a pin's.

`HashJob` is plain data (the store's URL and options, the file's path, its listed size and SHA-256), so that
any engine runs `hash_object` on it (`marin_data.engines.run_jobs`: threads here, or Ray tasks on a cluster,
each process opening a store once per URL and options). A file is read in one streaming GET, in
`marin_data.stores.base.READ_CHUNK` pieces (memory per job: one piece), and no further than one byte past its
listed size (that byte makes it oversized); a dropped connection, a 5xx or a slow server restarts the read
under `DOWNLOAD_POLICY`. The outcome is `Hashed`: a `Problem` (missing, truncated, oversized, modified) or
none, named by the file's path in the pin, and the bytes read. This is what ``verify --remote --deep``
runs: the store's own checksums are not consulted, the bytes are.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marin_data.corpus.verify import Problem, ProblemKind
from marin_data.errors import RemoteError
from marin_data.retry import RetryPolicy, retry_call
from marin_data.stores import open_store
from marin_data.stores.base import Store
from marin_data.transfer.plan import DOWNLOAD_POLICY

__all__ = ["HashJob", "Hashed", "hash_object", "job_store", "run_job"]


@dataclass(frozen=True)
class HashJob:
    """One file to re-hash: ``path`` in the store at ``url`` (opened with ``options``, `open_store`'s, as
    sorted pairs), listed with ``bytes`` and ``sha256``; ``optional``: a file the store may lack (a copy by
    content an older publish did not make), whose absence is no finding."""

    url: str
    options: tuple[tuple[str, Any], ...]
    path: str
    bytes: int
    sha256: str
    optional: bool = False
    policy: RetryPolicy = DOWNLOAD_POLICY

    def __call__(self) -> Hashed:
        return hash_object(self)


@dataclass(frozen=True)
class Hashed:
    """What re-hashing one file found: ``present`` (False: not in the store), the bytes read, a finding."""

    path: str
    present: bool
    bytes: int
    problem: Problem | None = None


def run_job(job: Callable[[], Any]) -> Any:
    """What an engine runs for a job that is its own work (`HashJob`, a cell's checks): ``job()``."""
    return job()


@functools.lru_cache(maxsize=16)
def job_store(url: str, options: tuple[tuple[str, Any], ...]) -> Store:
    """The store at ``url``, opened once per process (a store is safe to share between threads)."""
    return open_store(url, **dict(options))


def hash_object(job: HashJob) -> Hashed:
    """Stream ``job.path`` whole and compare its size and SHA-256 with the listed ones.

    Raises:
        RemoteError: the store failed (other than a missing file) past the retries.
    """
    store = job_store(job.url, job.options)
    where = store.describe(job.path)

    def attempt() -> tuple[str, int]:
        h, n = hashlib.sha256(), 0
        with store.read(job.path) as stream:  # no Range: an empty object takes none
            for piece in stream:
                piece = piece[:job.bytes + 1 - n]
                h.update(piece)
                n += len(piece)
                if n > job.bytes:  # one byte past the listed size is enough to call it oversized
                    break
        return h.hexdigest(), n

    try:
        digest, read = retry_call(attempt, policy=job.policy, what=where)
    except RemoteError as e:
        if e.status != 404:
            raise
        found = None if job.optional else Problem(job.path, ProblemKind.MISSING, f"not in {store.url}",
                                                  expected=_want(job))
        return Hashed(job.path, False, 0, found)
    return Hashed(job.path, True, read, _compare(job, where, digest, read))


def _want(job: HashJob) -> dict:
    return {"bytes": job.bytes, "sha256": job.sha256}


def _compare(job: HashJob, where: str, digest: str, read: int) -> Problem | None:
    if read < job.bytes:
        return Problem(job.path, ProblemKind.TRUNCATED, f"{where} is {read} bytes, {job.bytes} listed", _want(job),
                       {"bytes": read})
    if read > job.bytes:
        return Problem(job.path, ProblemKind.OVERSIZED, f"{where} is more than the {job.bytes} bytes listed",
                       _want(job), {"bytes": read})
    if digest != job.sha256:
        return Problem(job.path, ProblemKind.MODIFIED, f"{where} hashes to sha256 {digest[:12]}…, {job.sha256[:12]}… "
                       "listed (its bytes re-hashed)", _want(job), {"bytes": read, "sha256": digest})
    return None
