"""Where per-unit work runs: an *engine* maps a top-level function over picklable jobs.

The sharding pipeline describes its work as plain data (a job per input file, then a job per output shard)
and one top-level function per kind of job; each job writes its own staging output and returns small
stats. An engine only runs them, in any order and on any worker, so the output cannot depend on the
engine or the worker count. `marin_data.engines.local.LocalEngine` is a process pool on this machine;
`marin_data.engines.ray.RayEngine` runs the very same functions as Ray tasks on a Ray cluster. `ENGINES`
names both; the Ray one is imported only when asked for, so Ray stays an optional extra.
`marin_data.engines.threads.ThreadEngine` runs them on threads of this process, for work that waits on a store;
`run_jobs` runs such work on it for ``"local"``, and on the engine named otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

from marin_data.engines.local import LocalEngine
from marin_data.engines.threads import ThreadEngine

__all__ = ["Engine", "ENGINES", "make_engine", "run_jobs"]

J = TypeVar("J")
R = TypeVar("R")


class Engine(Protocol):
    """Runs ``fn(job)`` for each job and yields ``(index of the job, result)`` as results arrive.

    ``jobs`` may grow while the results are read: a job appended before the next result is asked for runs
    too, so a caller can add work that depends on results already in (the pipeline's packs, queued as soon
    as the units they read are done).
    """

    workers: int | None  # jobs that run at once (None until a cluster engine has connected and counted)

    def map_unordered(self, fn: Callable[[J], R], jobs: Sequence[J]) -> Iterator[tuple[int, R]]: ...

    def close(self) -> None: ...


def _local(workers: int | None, address: str | None) -> Engine:
    if address is not None:
        raise ValueError(f"the local engine runs on this machine and takes no address (got {address!r})")
    return LocalEngine(workers)


def _ray(workers: int | None, address: str | None) -> Engine:
    from marin_data.engines.ray import RayEngine  # imports ray, an optional extra: only when asked for

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


def run_jobs(fn: Callable[[J], R], jobs: Sequence[J], *, engine: str, workers: int | None, address: str | None = None,
             on_result: Callable[[int, R], None] | None = None) -> tuple[list[R], int]:
    """``fn(job)`` for every job, the results in the jobs' order, and how many ran at once.

    ``engine="local"`` runs them on ``workers`` threads of this process: for jobs that wait on a store
    (hashing releases the GIL too), a thread costs nothing to start and shares the store's connections.
    Another engine (`make_engine`: Ray) runs them as its tasks, ``workers`` at once (None: as the engine
    decides, a Ray cluster's CPUs). ``on_result(index, result)`` is told of each as it arrives.
    The first error stops the jobs not started and is raised.
    """
    results: list = [None] * len(jobs)
    if engine == "local":
        if address is not None:
            raise ValueError(f"the local engine runs on this machine and takes no address (got {address!r})")
        pool: Engine = ThreadEngine(workers or 1)
    else:
        pool = make_engine(engine, workers, address=address)
    with contextlib.closing(pool):
        for i, result in pool.map_unordered(fn, jobs):
            results[i] = result
            if on_result is not None:
                on_result(i, result)
        return results, pool.workers or workers or 1
