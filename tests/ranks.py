"""Start the gloo ranks of a test as forks of one server that has already imported torch and the training code.

`torch.multiprocessing.spawn` starts every rank as a fresh interpreter, and importing torch, DTensor and
torch.distributed.checkpoint costs each about 3 s of CPU: on a two-core machine, more than the small runs
the tests make (the FSDP layouts' fixture took 82 s with spawn, 44 s with this). `spawn_ranks` takes the
"forkserver" start method instead: one server per test process imports `PRELOAD` once, and every rank is a
fork of that server, not of the test process, so it starts as clean as a spawned one (no pytest threads, no
OpenMP pool, no state of earlier tests). Its target and arguments still travel pickled, and a rank's
failure or death (a SIGKILL included) raises as under `mp.spawn`.

The server keeps the environment and working directory it started with: give a rank what it needs as
arguments, not through os.environ.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed.checkpoint", "torch.distributed.tensor", "marin_model.moe",
           "marin_train.checkpoint", "marin_train.loop", "marin_train.parallel", "marin_data.loader",
           "marin_data.corpus.manifest"]


def spawn_ranks(fn: Callable, args: tuple, nprocs: int, *, join: bool = True) -> mp.ProcessContext | None:
    """`mp.spawn(fn, args, nprocs, join)`, the ranks forked from the preloaded server."""
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts: the first call's
    return mp.start_processes(fn, args=args, nprocs=nprocs, join=join, start_method="forkserver")
