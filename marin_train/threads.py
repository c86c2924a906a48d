"""How many intra-op threads a process of ``marin-train`` gives torch.

Two things decide it. Speed: torch starts one OpenMP thread per core, whatever else runs there, and those
threads meet at a barrier after every parallel op, so one descheduled thread (another process, this process's
own loader threads) stalls every op: on 2 busy cores a tiny-model run was 6-10x slower with torch's 2 threads
than with 1 (docs/benchmarks.md, "Training: intra-op threads"). Bits: torch's CPU kernels (the grouped GEMM
among them) split their sums by the thread count, so two processes agree to the last bit only when they use
as many threads; ``torchrun`` sets ``OMP_NUM_THREADS=1`` for several processes per node and nothing for one.

The rule, first match wins, and the log line says which applied:
1. ``--threads N``;
2. ``OMP_NUM_THREADS``, when set (torch already read it);
3. under ``torchrun`` (``LOCAL_WORLD_SIZE`` set), 1, whatever the process count, so that 1, 2 or 4
   processes compute the same bits;
4. otherwise the cores of this process's affinity mask (``os.sched_getaffinity``: a container's or
   ``taskset``'s limit, not the machine's count) less one left to the loader; never under 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = ["ThreadChoice", "choose_threads", "set_threads"]


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # torch's intra-op threads
    reason: str  # where the number comes from, for the log

    def describe(self) -> str:
        return f"torch intra-op threads: {self.threads} ({self.reason})"


def choose_threads(requested: int | None = None, environ: Mapping[str, str] | None = None,
                   cores: int | None = None) -> ThreadChoice:
    """The thread count of the module docstring's rule for ``requested`` (``--threads``), ``environ``
    (default ``os.environ``) and ``cores`` usable cores (default: this process's affinity)."""
    environ = os.environ if environ is None else environ
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads must be >= 1, got {requested}")
        return ThreadChoice(requested, f"--threads {requested}")
    if environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(torch.get_num_threads(), f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']}")
    local = environ.get("LOCAL_WORLD_SIZE")
    if local is not None:
        if not local.isdigit() or int(local) < 1:
            raise ValueError(f"LOCAL_WORLD_SIZE={local!r}: expected a positive integer (torchrun sets it)")
        return ThreadChoice(1, f"one per process under torchrun ({local} on this node), so any process count "
                               "computes the same bits; --threads or OMP_NUM_THREADS overrides")
    cores = cores if cores is not None else _usable_cores()
    return ThreadChoice(max(1, cores - 1), f"{cores} usable cores, one left to the loader; --threads or "
                                           "OMP_NUM_THREADS overrides")


def set_threads(requested: int | None = None, environ: Mapping[str, str] | None = None,
                cores: int | None = None) -> ThreadChoice:
    """`choose_threads`, applied to this process (``torch.set_num_threads``); returns the choice."""
    choice = choose_threads(requested, environ, cores)
    torch.set_num_threads(choice.threads)
    return choice


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may run on
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity mask to read
