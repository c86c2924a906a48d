"""Checkpoints of a run: model (with the balancing bias), optimizer, loader position, RNG states, step.

Each is written atomically (temporary file, fsync, rename, then the ``latest`` pointer the same way), so a
crash leaves the previous one intact; resuming continues bitwise (on CPU, 20 steps equal 10 + resume + 10).
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from marin_model.model import Transformer
from marin_train.config import TrainConfig

__all__ = ["Batches", "CHECKPOINT_FORMAT", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FORMAT = 1


class Batches(Protocol):
    """What `train` reads: the loader's contract (`marin_data.loader.TokenLoader` is one)."""

    def __iter__(self) -> Iterable[Mapping[str, torch.Tensor]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """``write(file)`` to a temporary file beside ``path``, fsync, rename over ``path``, fsync the folder."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(cfg: TrainConfig, *, step: int, model: Transformer, optimizer: torch.optim.Optimizer,
                    data: Batches, rank: int = 0, records: list[dict[str, float]] = ()) -> str:
    """Write ``step-NNNNNNNN.pt`` and then ``latest`` (rank 0; the others wait), keep the newest few, and append
    ``records`` to ``metrics.jsonl``. Returns the checkpoint's path."""
    root = Path(cfg.checkpoint_dir)
    path = root / _checkpoint_name(step)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        state = {"format": CHECKPOINT_FORMAT, "step": step, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict(), "loader": data.state_dict(),
                 "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                         "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                 "config": asdict(cfg)}
        _atomic_write(path, lambda f: torch.save(state, f))
        _atomic_write(root / "latest", lambda f: f.write(path.name.encode()))
        for old in sorted(root.glob("step-*.pt"))[:-max(1, cfg.keep_checkpoints)]:
            old.unlink(missing_ok=True)
        with open(root / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    if dist.is_initialized():
        dist.barrier()
    return str(path)


def latest_checkpoint(checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """The checkpoint ``latest`` names in ``checkpoint_dir``, or None."""
    if checkpoint_dir is None:
        return None
    pointer = Path(checkpoint_dir) / "latest"
    return Path(checkpoint_dir) / pointer.read_text().strip() if pointer.exists() else None


def load_checkpoint(path: str | os.PathLike, *, model: Transformer, optimizer: torch.optim.Optimizer | None = None,
                    data: Batches | None = None) -> int:
    """Restore what `save_checkpoint` wrote into ``model``, ``optimizer`` and ``data``; return its step."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, expected {CHECKPOINT_FORMAT}")
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if data is not None:
        data.load_state_dict(state["loader"])
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return int(state["step"])
