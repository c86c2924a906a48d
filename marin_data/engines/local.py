"""The local engine: a process pool on this machine, and the set-up every engine's worker processes share.

`LocalEngine` implements `marin_data.engines.Engine`; `configure_worker` and `default_workers` are used by
the Ray engine (`marin_data.engines.ray`) too.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TypeVar

__all__ = ["LocalEngine", "configure_worker", "default_workers"]

J = TypeVar("J")
R = TypeVar("R")


def default_workers() -> int:
    """The CPUs this process may use (its affinity mask, not the machine's core count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def configure_worker() -> None:
    """Set up a worker process (of any engine) before it runs its first job.

    One worker = one core: the engine's workers are the parallelism, so the tokenizers' Rayon pool and
    Arrow's thread pool stay at one thread instead of each claiming every core (oversubscription), and so
    does OpenBLAS, which no job uses but whose threads spin after numpy's import: ~0.1 s of CPU per worker
    start taken from the other workers (*measured*, 2-vCPU Xeon). Cheap and idempotent; it must run before
    ``tokenizers`` starts its thread pool and before numpy is imported, as in a fresh pool worker.
    """
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    import pyarrow

    pyarrow.set_cpu_count(1)


def _pool_worker() -> None:
    """`configure_worker`, and an exit that skips the interpreter's teardown once the pool lets the worker go.

    By then every result has been handed back (the pool's queues are flushed before ``atexit`` runs), and
    tearing down numpy, pyarrow and a loaded tokenizer only delays ``close``, which waits for the workers:
    0.15-0.4 s per worker on 2 busy cores against 0.01-0.06 s for ``os._exit`` (*measured*), paid once per
    run and so a larger share of a run the more workers share it. The pool watches its workers' sentinels,
    not their exit codes.
    """
    configure_worker()
    atexit.register(_exit_now)


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class LocalEngine:
    """A pool of ``workers`` processes on this machine, started on first use.

    Processes are *spawned*, not forked: the parent may hold threads (progress bars, Arrow) and an
    initialised tokenizer, which a fork would copy in an undefined state. Jobs run in the order given, those
    appended to ``jobs`` while results are read after the others. If a job raises, the jobs not yet started
    are cancelled, those running finish (their staging output is kept for the re-run) and the error is
    re-raised.
    """

    def __init__(self, workers: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")
        self._pool: ProcessPoolExecutor | None = None

    def map_unordered(self, fn: Callable[[J], R], jobs: Sequence[J]) -> Iterator[tuple[int, R]]:
        if not jobs:
            return
        if self._pool is None:
            import multiprocessing

            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_pool_worker)
        finished: queue.SimpleQueue[Future] = queue.SimpleQueue()  # futures as they finish, in O(1) each
        running: dict[Future, int] = {}
        submitted = 0
        try:
            while submitted < len(jobs) or running:
                while submitted < len(jobs):  # the jobs, then any appended since the last result
                    future = self._pool.submit(fn, jobs[submitted])
                    running[future] = submitted
                    future.add_done_callback(finished.put)
                    submitted += 1
                future = finished.get()
                yield running.pop(future), future.result()
        finally:
            for future in running:
                future.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
