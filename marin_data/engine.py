"""Where per-unit work runs: an *engine* maps a top-level function over picklable jobs.

The sharding pipeline describes its work as plain data (a job per input file, then a job per output shard)
and one top-level function per kind of job; each job writes its own staging output and returns small
stats. An engine only runs them, in any order and on any worker, so the output cannot depend on the
engine or the worker count. `LocalEngine` is a process pool on this machine; `marin_data.ray_engine.RayEngine`
(issue 10) runs the very same functions as Ray tasks on a Ray cluster. `ENGINES` names both; the Ray one is
imported only when asked for, so Ray stays an optional extra.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Protocol, TypeVar

__all__ = ["Engine", "LocalEngine", "ENGINES", "configure_worker", "default_workers", "make_engine"]

J = TypeVar("J")
R = TypeVar("R")


class Engine(Protocol):
    """Runs ``fn(job)`` for each job and yields ``(index of the job, result)`` as results arrive."""

    workers: int | None  # jobs that run at once (None until a cluster engine has connected and counted)

    def map_unordered(self, fn: Callable[[J], R], jobs: Sequence[J]) -> Iterator[tuple[int, R]]: ...

    def close(self) -> None: ...


def default_workers() -> int:
    """The CPUs this process may use (its affinity mask, not the machine's core count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def configure_worker() -> None:
    """Set up a worker process (of any engine) before it runs its first job.

    One worker = one core: the engine's workers are the parallelism, so the tokenizers' Rayon pool and
    Arrow's thread pool stay at one thread instead of each claiming every core (oversubscription). Cheap
    and idempotent; it must run before ``tokenizers`` starts its thread pool.
    """
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import pyarrow

    pyarrow.set_cpu_count(1)


class LocalEngine:
    """A pool of ``workers`` processes on this machine, started on first use.

    Processes are *spawned*, not forked: the parent may hold threads (progress bars, Arrow) and an
    initialised tokenizer, which a fork would copy in an undefined state. If a job raises, the jobs not yet
    started are cancelled, those running finish (their staging output is kept for the re-run) and the error
    is re-raised.
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
                                             initializer=configure_worker)
        futures = {self._pool.submit(fn, job): i for i, job in enumerate(jobs)}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _local(workers: int | None, address: str | None) -> Engine:
    if address is not None:
        raise ValueError(f"the local engine runs on this machine and takes no address (got {address!r})")
    return LocalEngine(workers)


def _ray(workers: int | None, address: str | None) -> Engine:
    from marin_data.ray_engine import RayEngine  # imports ray, an optional extra: only when asked for

    return RayEngine(workers, address=address)


# name -> factory(workers, address)
ENGINES: dict[str, Callable[[int | None, str | None], Engine]] = {"local": _local, "ray": _ray}


def make_engine(name: str, workers: int | None, *, address: str | None = None) -> Engine:
    """The engine registered as ``name``.

    Args:
        name: a key of `ENGINES`.
        workers: parallel workers (None: one per usable CPU of this machine, or of the Ray cluster).
        address: where the engine's cluster is (Ray: ``host:port`` or ``auto``); None runs on this machine.

    Raises:
        ValueError: an unknown name, or an address for the local engine.
        MissingExtraError: the engine's optional dependency is not installed.
    """
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}")
    return ENGINES[name](workers, address)
