"""The Ray engine: the pipeline's per-unit work functions as Ray tasks, on a cluster or on this machine.

`RayEngine` implements `marin_data.engines.Engine` with the very functions the local process pool runs
(`marin_data.corpus.units.tokenize_unit`, `marin_data.corpus.packs.pack_shard`,
`marin_data.corpus.verify.check_file`), so the output is the same bytes whichever engine wrote it. What Ray adds:

- **Where**: ``address=None`` starts a private local Ray instance with ``workers`` CPUs (no dashboard) and
  shuts it down on `close`; ``address="auto"`` or ``"HOST:PORT"`` joins a running cluster and leaves it
  running. A process that already called ``ray.init`` (a notebook, a test) is used as it is. A cluster's
  nodes must see the corpus, the inputs and the tokenizer at the same paths (a shared file system) and have
  marin installed: a task gets plain paths, not bytes.
- **Retries**: a task whose worker process dies (OOM killer, a lost node) is re-run up to ``max_retries``
  times (Ray's ``max_retries``), and so is one that fails with a plain `OSError` (a flaky network file
  system; Ray's ``retry_exceptions``). A `MarinDataError` (a malformed record, an unreadable input) is
  deterministic: it is never retried and reaches the caller as the same typed error the local engine
  raises. Retrying is safe because each task writes its outputs atomically and its done marker last.
- **Resume**: the pipeline skips every job whose done marker exists before it asks an engine for anything,
  so a re-run after a crash redoes only the unfinished work, on either engine.
- **Progress and memory**: at most ``2 x workers`` tasks are in flight (the cluster's CPUs when
  ``workers`` is None), so 100,000 jobs never become 100,000 pending objects; results are yielded as tasks
  finish (``ray.wait``), which moves the caller's progress bar.

On an error or Ctrl-C the tasks still queued or running are cancelled (finished ones keep their outputs);
the local engine instead lets running jobs finish. Either way nothing half-written has a final name.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from marin_data.engines.local import configure_worker, default_workers
from marin_data.errors import EngineError, MarinDataError, MissingExtraError

__all__ = ["RayEngine", "DEFAULT_MAX_RETRIES", "CONNECT_TIMEOUT_S"]

J = TypeVar("J")
R = TypeVar("R")

DEFAULT_MAX_RETRIES = 3  # attempts after the first, for a dead worker or a transient OSError
CONNECT_TIMEOUT_S = 10.0  # how long a cluster address may take to accept a TCP connection


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise MissingExtraError("--engine ray needs Ray, which is not installed: pip install 'marin[ray]'") from e
    return ray


class _Transient(Exception):
    """Marks a worker-side failure worth retrying (Ray retries this type only); the driver unwraps it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _attempt(fn: Callable[[J], R], job: J) -> R:
    """What each Ray task runs: ``fn(job)`` in a worker set up like the local pool's, with retryable
    failures marked. A `MarinDataError` is a verdict on the input, so it passes through unmarked."""
    configure_worker()
    try:
        return fn(job)
    except MarinDataError:
        raise
    except OSError as e:
        raise _Transient(e) from e


class RayEngine:
    """Runs jobs as Ray tasks (one CPU each) on a Ray cluster or a local Ray instance.

    Args:
        workers: local instance: its CPUs (default: this process's usable cores); cluster: the most tasks
            running at once (default: all the cluster's CPUs, counted when the engine connects).
        address: a Ray cluster (``auto``, ``HOST:PORT``; a Ray Client ``ray://HOST:PORT`` also needs
            ``pip install 'ray[client]'``); None starts a local instance.
        max_retries: re-runs of a task whose worker died or that raised a plain `OSError`.

    Raises:
        MissingExtraError: Ray is not installed.
        EngineError: (when first used) the cluster does not answer, or Ray cannot start.
    """

    def __init__(self, workers: int | None = None, *, address: str | None = None,
                 max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self._ray = _import_ray()
        self.workers = workers
        self.address = address
        self.max_retries = max_retries
        self._owns_ray = False  # whether this engine started Ray, and so shuts it down
        self._task = None

    def map_unordered(self, fn: Callable[[J], R], jobs: Sequence[J]) -> Iterator[tuple[int, R]]:
        if not jobs:
            return
        ray = self._ray
        task = self._start()
        window = 2 * self.workers  # a queued task per worker, so none idles between a result and the next submit
        running: dict[Any, int] = {}  # ObjectRef -> index of its job
        submitted = 0
        try:
            while running or submitted < len(jobs):
                while submitted < len(jobs) and len(running) < window:
                    running[task.remote(fn, jobs[submitted])] = submitted
                    submitted += 1
                (ref,), _ = ray.wait(list(running), num_returns=1)
                yield running.pop(ref), self._result(ref)
        finally:
            for ref in running:  # an error or Ctrl-C: stop what is queued or running
                ray.cancel(ref)

    def close(self) -> None:
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False
        self._task = None

    def _start(self) -> Any:
        """Connect to (or start) Ray once; return the remote function that runs `_attempt`."""
        ray = self._ray
        if self._task is not None:
            return self._task
        if not ray.is_initialized():
            if self.address is not None:
                _check_answers(self.address)
            options: dict[str, Any] = {"address": self.address} if self.address else {
                # "local": a new private instance even where RAY_ADDRESS or a `ray start` cluster exists.
                "address": "local", "num_cpus": self.workers or default_workers(),
                "object_store_memory": 128 << 20}  # results are small stats; Ray's default takes 30% of RAM
            try:
                ray.init(**options, include_dashboard=False, logging_level=logging.WARNING)
            except Exception as e:  # noqa: BLE001 - Ray raises bare Exception too (a node that timed out starting)
                # (ray:// addresses without `pip install 'ray[client]'` land here too, with Ray's own hint)
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                raise EngineError(f"cannot start or reach {where}: {e}") from e
            self._owns_ray = self.address is None
        self.workers = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._task = ray.remote(_attempt).options(num_cpus=1, max_retries=self.max_retries,
                                                  retry_exceptions=[_Transient])
        return self._task

    def _result(self, ref: Any) -> Any:
        """A finished task's value, or its error as the work function raised it."""
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause
            raise (cause.error if isinstance(cause, _Transient) else cause) from e
        except ray.exceptions.RayError as e:  # the worker or node died on every attempt, an object was lost
            raise EngineError(f"a Ray task failed {self.max_retries + 1} times: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from e


def _check_answers(address: str) -> None:
    """Fail fast, naming the address, when nothing listens there: ``ray.init`` itself retries for minutes."""
    if address == "auto":
        return  # Ray reads the address of the cluster started on this node
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise EngineError(f"not a Ray cluster address: {address!r} (use HOST:PORT, ray://HOST:PORT or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise EngineError(f"no Ray cluster answers at {address}: {e.strerror or e}") from e
