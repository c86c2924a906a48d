"""The thread engine: `marin_data.engines.Engine` on a thread pool of this process.

For per-file work that waits on a store more than it computes, and whose computing (SHA-256, CRC32C, LZ4)
releases the GIL over large buffers: ``adopt`` of a remote store hashes each file as it streams. A process
pool would spawn and import per run for no gain, and a job's arguments need not be pickled; the same job
functions still run unchanged on `marin_data.engines.ray.RayEngine`. If a job raises, the jobs not yet
started are cancelled, those running finish, and the error is re-raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from marin_data.engines.local import default_workers

__all__ = ["ThreadEngine"]

J = TypeVar("J")
R = TypeVar("R")


class ThreadEngine:
    """``workers`` threads (default: one per usable core), at most ``2 x workers`` jobs submitted at once."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")

    def map_unordered(self, fn: Callable[[J], R], jobs: Sequence[J]) -> Iterator[tuple[int, R]]:
        if not jobs:
            return
        with ThreadPoolExecutor(self.workers, thread_name_prefix="engine") as pool:
            running: dict[Future, int] = {}
            submitted = 0
            try:
                while running or submitted < len(jobs):
                    while submitted < len(jobs) and len(running) < 2 * self.workers:
                        running[pool.submit(fn, jobs[submitted])] = submitted
                        submitted += 1
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        yield running.pop(future), future.result()
            finally:
                for future in running:
                    future.cancel()

    def close(self) -> None:
        pass
