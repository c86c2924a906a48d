"""How many intra-op threads a training process gives torch, chosen from the cores it may run on.

torch starts one OpenMP thread per core, whatever else runs there. Those threads meet at a barrier after
every parallel op, so when one of them is descheduled, by another process or by this process's own loader
threads (prefetch, page-table filler, shard fetches), every op waits for it: on 2 busy cores a tiny-model
run was 6-10x slower with torch's 2 threads than with 1 (docs/benchmarks.md, "Training: intra-op threads").
``torchrun`` sets ``OMP_NUM_THREADS=1`` for several processes per node; a plain ``marin-train`` had nothing.

The rule: ``OMP_NUM_THREADS``, when set, wins (torch already read it). Otherwise the cores of this process's
affinity mask (``os.sched_getaffinity``: a container's or ``taskset``'s limit, not the machine's count),
divided among the ``LOCAL_WORLD_SIZE`` processes of this node, less one left to the loader's threads and the
Python of the step; never under 1. So 2 cores -> 1 thread, 16 cores -> 15, 16 cores / 4 processes -> 3.
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


def choose_threads(environ: Mapping[str, str] | None = None, cores: int | None = None) -> ThreadChoice:
    """The thread count of the module docstring's rule for ``environ`` (default ``os.environ``) and ``cores``
    usable cores (default: this process's affinity). With ``OMP_NUM_THREADS`` set, torch's own count."""
    environ = os.environ if environ is None else environ
    if environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(torch.get_num_threads(), f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']}")
    cores = cores if cores is not None else _usable_cores()
    local = environ.get("LOCAL_WORLD_SIZE", "1")
    if not local.isdigit() or int(local) < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE={local!r}: expected a positive integer (torchrun sets it)")
    threads = max(1, cores // int(local) - 1)
    per = f" / {local} processes on this node" if int(local) > 1 else ""
    return ThreadChoice(threads, f"{cores} usable cores{per}, one left to the loader; OMP_NUM_THREADS overrides")


def set_threads(environ: Mapping[str, str] | None = None, cores: int | None = None) -> ThreadChoice:
    """`choose_threads`, applied to this process (``torch.set_num_threads``); returns the choice."""
    choice = choose_threads(environ, cores)
    torch.set_num_threads(choice.threads)
    return choice


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may run on
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity mask to read
