"""Sharded checkpoints of a run (``torch.distributed.checkpoint``): model, optimizer, loader, RNG, step, config.

A checkpoint is a directory ``step-NNNNNNNN/``: every rank writes its own shards of the model (the balancing
bias included) and of the optimizer state in parallel (DCP's ``*.distcp`` files and ``.metadata``), and rank 0
adds ``trainer.pt`` (loader position, RNG states, step) and ``config.json`` (the run's and the model's
config, the global batch, the layout). Parameters are stored at their global shapes, routed experts too, so
DCP reshards on load: a run saved at one world size or EP degree resumes at another.

Atomic at the checkpoint level: the ranks write into ``.step-NNNNNNNN.part/``, which rank 0 renames to its
final name once complete, and only then points ``latest`` at it (a file replaced by rename). A crash at any
point leaves the previous checkpoint as ``latest``. Nothing is written through a symlink at a name this
module writes; the checkpoint directory itself may be one.

The single-file checkpoints of earlier versions (``step-NNNNNNNN.pt``, one ``torch.save`` by rank 0) are
not loadable: resuming from one raises, naming it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from marin_model.model import Transformer
from marin_train.config import TrainConfig

__all__ = ["Batches", "CHECKPOINT_FORMAT", "atomic_write", "checkpoint_config", "latest_checkpoint", "load_checkpoint",
           "prune_checkpoints", "resolve_checkpoint", "restore_loader", "resume_config", "save_checkpoint"]

CHECKPOINT_FORMAT = 2


class Batches(Protocol):
    """What `train` reads: the loader's contract (`marin_data.loader.TokenLoader` is one)."""

    def __iter__(self) -> Iterable[Mapping[str, torch.Tensor]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None: ...


def _refuse_symlink(path: Path) -> Path:
    if path.is_symlink():
        raise FileExistsError(f"{path} is a symlink; checkpoints are never written through one (remove it)")
    return path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """``write(file)`` to a new temporary file beside ``path``, fsync, rename over ``path``, fsync the folder."""
    tmp = _refuse_symlink(path).with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def save_checkpoint(cfg: TrainConfig, *, step: int, model: Transformer, optimizer: torch.optim.Optimizer,
                    data: Batches, records: Iterable[dict[str, float]] = (),
                    log: Callable[[str], None] = lambda line: None) -> str:
    """Write ``step-NNNNNNNN/`` (all ranks, each its shards) and then ``latest`` (rank 0), keep the newest
    ``cfg.keep_checkpoints`` (`prune_checkpoints`; ``log`` names each one deleted), and append ``records`` to
    ``metrics.jsonl``. Returns the checkpoint's path.

    The RNG states saved are rank 0's: the ranks draw the same stream (same seed, no per-rank draws)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(cfg.checkpoint_dir)
    name = f"step-{step:08d}"
    final, part = root / name, root / f".{name}.part"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for path in (final, part, root / "latest", root / "metrics.jsonl"):
            _refuse_symlink(path)
        shutil.rmtree(part, ignore_errors=True)  # left by a save that crashed
        part.mkdir()
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=part)
    if rank == 0:
        trainer = {"format": CHECKPOINT_FORMAT, "step": step, "loader": data.state_dict(), "rng": _rng_state()}
        config = {"format": CHECKPOINT_FORMAT, "step": step, "world_size": world, "ep": cfg.ep,
                  "global_batch": cfg.global_batch(world), "train": asdict(cfg), "model": asdict(model.cfg)}
        atomic_write(part / "trainer.pt", lambda f: torch.save(trainer, f))
        atomic_write(part / "config.json", lambda f: f.write(json.dumps(config, indent=1, default=str).encode()))
        _fsync(part)
        shutil.rmtree(final, ignore_errors=True)  # an unreferenced one of this step, left by a crash
        os.replace(part, final)
        _fsync(root)
        atomic_write(root / "latest", lambda f: f.write(name.encode()))
        for old in prune_checkpoints(root, keep=cfg.keep_checkpoints, current=final):
            log(f"deleted {old} (--keep-checkpoints {cfg.keep_checkpoints} keeps the newest)")
        with os.fdopen(os.open(root / "metrics.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                               0o644), "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    dist.barrier()
    return str(final)


def prune_checkpoints(root: Path, *, keep: int, current: Path) -> list[Path]:
    """Delete the oldest ``step-*`` checkpoints of ``root`` so that ``keep`` remain, ``current`` (the one just
    written, which ``latest`` names) always among them; ``keep`` 0 deletes nothing. Returns what was deleted."""
    if keep == 0:
        return []
    others = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.is_symlink() and p != current)
    doomed = others[:max(0, len(others) - (keep - 1))]
    for old in doomed:
        shutil.rmtree(old)
    return doomed


def latest_checkpoint(checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """The checkpoint ``latest`` names in ``checkpoint_dir``, or None."""
    if checkpoint_dir is None:
        return None
    pointer = Path(checkpoint_dir) / "latest"
    return Path(checkpoint_dir) / pointer.read_text().strip() if pointer.exists() else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint ``path`` names: a ``step-NNNNNNNN`` directory, or a run's directory (the checkpoint
    its ``latest`` names). Raises ValueError saying what ``path`` is instead."""
    path = Path(path)
    if (path / "latest").is_file():
        named = latest_checkpoint(path)
        if not (named / "config.json").is_file():
            raise ValueError(f"{path}: its latest names {named.name}, which is not a complete checkpoint")
        return named
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: neither a checkpoint (step-NNNNNNNN/ with config.json) nor a run directory "
                         "(with latest)")
    return path


def checkpoint_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint: the run's and the model's config, global batch, layout, step."""
    path = Path(path)
    if path.is_file() or not (path / "config.json").exists():
        raise ValueError(f"{path}: not a checkpoint directory of this version (format {CHECKPOINT_FORMAT}); "
                         "the single-file checkpoints (step-NNNNNNNN.pt) of earlier versions cannot be loaded: "
                         "start afresh (--no-resume) or load them with the version that wrote them")
    return json.loads((path / "config.json").read_text())


def resume_config(cfg: TrainConfig, world: int) -> TrainConfig:
    """``cfg`` with the per-rank batch that keeps the global batch of the checkpoint a run resumes from (the
    global batch is part of the checkpoint), unchanged when there is none. Raises ValueError when that global
    batch does not divide over ``world`` ranks x ``cfg.accumulation`` micro-batches."""
    previous = latest_checkpoint(cfg.checkpoint_dir)
    if previous is None:
        return cfg
    global_batch = checkpoint_config(previous)["global_batch"]
    per_rank, rest = divmod(global_batch, world * cfg.accumulation)
    if rest or not per_rank:
        raise ValueError(f"{previous}: the global batch of {global_batch} sequences does not divide over {world} "
                         f"ranks x {cfg.accumulation} micro-batches; choose --accumulation so that it does")
    return replace(cfg, batch_size=per_rank)


def restore_loader(path: str | os.PathLike, data: Batches, *, strict: bool = True) -> None:
    """Only the loader position of a checkpoint (`load_checkpoint` with ``data`` restores it too): a trainer
    that knows where its stream continues can start fetching those shards before it builds the model."""
    checkpoint_config(path)  # refuses what is not a checkpoint of this version, naming it
    trainer = torch.load(Path(path) / "trainer.pt", map_location="cpu", weights_only=False)
    data.load_state_dict(trainer["loader"], **({} if strict else {"strict": False}))


def load_checkpoint(path: str | os.PathLike, *, model: Transformer, optimizer: torch.optim.Optimizer,
                    data: Batches | None = None, global_batch: int | None = None, strict_data: bool = True) -> int:
    """Restore what `save_checkpoint` wrote into the sharded ``model``, ``optimizer`` and ``data``, at any
    world size or EP degree; return its step. ``global_batch``, when given, must be the checkpoint's.
    ``strict_data=False`` lets the loader continue a stream whose description changed (a new mixture phase)."""
    config = checkpoint_config(path)
    if global_batch is not None and global_batch != config["global_batch"]:
        raise ValueError(f"{path} was trained with a global batch of {config['global_batch']} sequences, this run "
                         f"has {global_batch}: set the per-rank batch with marin_train.checkpoint.resume_config")
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    trainer = torch.load(Path(path) / "trainer.pt", map_location="cpu", weights_only=False)
    if data is not None:
        data.load_state_dict(trainer["loader"], **({} if strict_data else {"strict": False}))
    _set_rng_state(trainer["rng"])
    return int(trainer["step"])
