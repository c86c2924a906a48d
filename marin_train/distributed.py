"""Joining and leaving the process group that ``torchrun`` describes (gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

__all__ = ["init_distributed", "shutdown_distributed"]


def init_distributed() -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)``; joins the process group ``torchrun`` describes in the environment, or a
    group of one without torchrun (the sharded model takes one code path at every world size), once. Gloo
    serves CPU tensors, NCCL CUDA ones."""
    cuda = torch.cuda.is_available()
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    if not cuda:
        return rank, world, torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return rank, world, torch.device("cuda", local)


def shutdown_distributed() -> None:
    """Leaves the process group (if one is joined): barrier, destroy, then collect garbage at once.

    On gloo a group freed by the collector during interpreter shutdown can abort the process after all its
    work is done (docs/design.md, "Training"); collecting here, while the interpreter is whole, avoids it."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()
