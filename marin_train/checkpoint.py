"""Sharded checkpoints of a run (``torch.distributed.checkpoint``): model, optimizer, loader, RNG, step, config.

A checkpoint is a directory ``step-NNNNNNNN/``: every rank writes its own shards of the model (the balancing
bias included) and of the optimizer state in parallel (DCP's ``*.distcp`` files and ``.metadata``), and rank 0
adds ``trainer.pt`` (loader position, RNG states, step) and ``config.json`` (the run's and the model's
config, the global batch, the layout, the data stream's fingerprint). Parameters are stored at their global
shapes, routed experts too, so DCP reshards on load: a run saved at one world size or EP degree resumes at
another.

Atomic at the checkpoint level: the ranks write into ``.step-NNNNNNNN.part/``, which rank 0 renames to its
final name once complete, and only then points ``latest`` at it (a file replaced by rename). A crash at any
point leaves the previous checkpoint as ``latest``. Nothing is written through a symlink at a name this
module writes; the checkpoint directory itself may be one.

Sealed (`marin_train.seal`): once every rank's files are written, ``seal.json`` records the step and each
file's size and sha256. Nothing of a checkpoint is read before its seal holds, and nothing in it is unpickled
beyond tensors and plain values (`marin_train.safe_load`). ``trainer.pt`` keeps the metrics of the steps
since the previous checkpoint, so a resume restores ``metrics.jsonl`` to exactly the lines of the steps up to
its own (a kill after the commit and before the append lost none). A save that finds the disk full raises
`InsufficientSpaceError` and leaves the previous checkpoint as ``latest``.

Checkpoints of format 2 (no seal) still load, unchecked. The single-file checkpoints of earlier versions
(``step-NNNNNNNN.pt``, one ``torch.save`` by rank 0) are not loadable: resuming from one raises, naming it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from marin_data.fileio.atomic import NO_SPACE
from marin_data.errors import CheckpointDamagedError, InsufficientSpaceError, LoaderStateMismatchError
from marin_model.model import Transformer
from marin_train.config import DataConfig, TrainConfig
from marin_train.safe_load import load_shards, trainer_state
from marin_train.seal import CHECKPOINT_FORMAT, SEAL, damaged, problem, read_sealed, seal_document, verify

__all__ = ["Batches", "CHECKPOINT_FORMAT", "SEAL", "atomic_write", "checkpoint_config", "latest_checkpoint",
           "load_checkpoint", "prune_checkpoints", "resolve_checkpoint", "restore_loader", "resume_config",
           "save_checkpoint"]

METRICS = "metrics.jsonl"


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
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # the keys as plain ints: no numpy type to unpickle
    return {"torch": torch.get_rng_state(), "numpy": (kind, keys.tolist(), pos, has_gauss, gauss),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def save_checkpoint(cfg: TrainConfig, *, step: int, model: Transformer, optimizer: torch.optim.Optimizer,
                    data: Batches, records: Iterable[dict[str, float]] = (),
                    log: Callable[[str], None] = lambda line: None,
                    lr_schedule: Mapping[str, float] | None = None) -> str:
    """Write ``step-NNNNNNNN/`` (all ranks, each its shards), seal it (all ranks) and then point ``latest`` at
    it (rank 0), keep the newest ``cfg.keep_checkpoints`` (`prune_checkpoints`; ``log`` names each one
    deleted), and append ``records`` (the metrics of the steps since the previous checkpoint, kept in the
    checkpoint too) to ``metrics.jsonl``. Returns its path.

    The RNG states saved are rank 0's: the ranks draw the same stream (same seed, no per-rank draws). A full
    disk (or quota) raises `InsufficientSpaceError` (`_space_errors`). ``lr_schedule``: the learning-rate
    schedule the run follows (`marin_train.loop.lr_schedule`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(cfg.checkpoint_dir)
    name = f"step-{step:08d}"
    final, part = root / name, root / f".{name}.part"
    records = list(records)
    with _space_errors(final, rank):
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            for path in (final, part, root / "latest", root / METRICS):
                _refuse_symlink(path)
            shutil.rmtree(part, ignore_errors=True)  # left by a save that crashed
            part.mkdir()
        dist.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=part)
        if rank == 0:
            loader = data.state_dict()
            trainer = {"format": CHECKPOINT_FORMAT, "step": step, "loader": loader, "rng": _rng_state(),
                       "records": records}
            # the stream's fingerprint in plain JSON too: `marin-train trace` checks the stream it rebuilds against it
            config = {"format": CHECKPOINT_FORMAT, "step": step, "world_size": world, "ep": cfg.ep,
                      "global_batch": cfg.global_batch(world), "train": asdict(cfg), "model": asdict(model.cfg),
                      "stream": {k: loader[k] for k in ("fingerprint", "components") if k in loader},
                      **({"lr_schedule": dict(lr_schedule)} if lr_schedule is not None else {})}
            atomic_write(part / "trainer.pt", lambda f: torch.save(trainer, f))
            atomic_write(part / "config.json", lambda f: f.write(json.dumps(config, indent=1, default=str).encode()))
        _seal(part, step, rank, world)
        if rank == 0:
            _fsync(part)
            shutil.rmtree(final, ignore_errors=True)  # an unreferenced one of this step, left by a crash
            os.replace(part, final)
            _fsync(root)
            atomic_write(root / "latest", lambda f: f.write(name.encode()))
            for old in prune_checkpoints(root, keep=cfg.keep_checkpoints, current=final):
                log(f"deleted {old} (--keep-checkpoints {cfg.keep_checkpoints} keeps the newest)")
            # A kill before this append loses nothing: the lines are in trainer.pt, and a resume restores them.
            with os.fdopen(os.open(root / METRICS, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644),
                           "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
    dist.barrier()
    return str(final)


@contextmanager
def _space_errors(final: Path, rank: int) -> Iterator[None]:
    """Raise a full disk (or quota) met while saving the checkpoint ``final`` as `InsufficientSpaceError`
    naming it, and give back the space its unfinished ``.part`` folder took. ``latest`` then still names the
    previous checkpoint (or this one, complete, when only the metrics append failed), so a re-run resumes."""
    try:
        yield
    except (OSError, RuntimeError, CheckpointException) as e:
        full = _full_disk(e, final.parent)
        if full is None:
            raise
        if rank == 0:
            shutil.rmtree(final.with_name(f".{final.name}.part"), ignore_errors=True)
        raise InsufficientSpaceError(f"cannot save this checkpoint: {full}", path=str(final)) from e


def _full_disk(error: BaseException, folder: Path) -> str | None:
    """Why ``error`` is a full disk, or None. Torch reports a failed write as a RuntimeError ("unexpected pos")
    whose context is the OSError, and DCP gathers the ranks' failures in a `CheckpointException`, through a
    pickle that drops that context: then a ``folder`` left with under 1 MiB free says it."""
    todo, seen = [error], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e.strerror or os.strerror(e.errno)
        if isinstance(e, CheckpointException):
            todo += [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
        todo += [e.__cause__, e.__context__]
    if isinstance(error, OSError):  # the system's own error, whose errno says what it is
        return None
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return f"{free:,} bytes are free on its file system" if free < 1 << 20 else None

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


def _seal(part: Path, step: int, rank: int, world: int) -> None:
    """Write ``part/seal.json`` (`marin_train.seal.seal_document`: all ranks hash, rank 0 writes)."""
    seal = seal_document(part, step, rank, world)
    if rank == 0:
        atomic_write(part / SEAL, lambda f: f.write(json.dumps(seal, indent=1).encode()))


# --- metrics.jsonl -------------------------------------------------------------------------------------


def _reversed_lines(f) -> Iterable[tuple[int, bytes]]:
    """``(offset, line)`` of each line of the binary file ``f``, the last first, without the newline."""
    pos, rest = f.seek(0, os.SEEK_END), b""
    while pos > 0:
        n = min(1 << 16, pos)
        pos -= n
        f.seek(pos)
        block = f.read(n) + rest
        lines = block.split(b"\n")
        end = pos + len(block)
        for line in reversed(lines[1:]):
            end -= len(line)
            yield end, line
            end -= 1
        rest = lines[0]
    yield 0, rest


def _restore_metrics(path: Path, records: list[dict[str, float]], step: int) -> None:
    """Make ``metrics.jsonl`` hold its lines of the steps before ``records`` (what the checkpoint at ``step``
    kept of the steps since the one before it), then exactly ``records``.

    A kill after that checkpoint's commit lost its lines, and lines of steps past it belong to a run that went
    further (from a checkpoint since lost or damaged): those steps run again and log again. Only the end of
    the file is read, back to the last line of an earlier step; nothing is written when it is already right."""
    first = int(records[0]["step"]) if records else step + 1
    want = b"".join((json.dumps(r) + "\n").encode() for r in records)
    _refuse_symlink(path)
    with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644), "r+b") as f:
        end, keep = f.seek(0, os.SEEK_END), 0
        for offset, line in _reversed_lines(f):
            if offset + len(line) == end:
                continue  # the last line: complete lines end with a newline, so this one is empty or torn
            try:
                earlier = int(json.loads(line)["step"]) < first
            except (ValueError, TypeError, KeyError):
                continue
            if earlier:
                keep = offset + len(line) + 1
                break
        f.seek(keep)
        if f.read(len(want) + 1) == want:
            return
        f.truncate(keep)
        f.seek(keep)
        f.write(want)
        f.flush()
        os.fsync(f.fileno())


# --- loading -------------------------------------------------------------------------------------------


def latest_checkpoint(checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """The checkpoint ``latest`` names in ``checkpoint_dir``, or None when there is no ``latest``.

    Raises `CheckpointDamagedError` when it names a step that is missing, unsealed or has a sealed file
    missing or of another size, offering the newest intact one (the files are hashed by `load_checkpoint`)."""
    if checkpoint_dir is None:
        return None
    pointer = Path(checkpoint_dir) / "latest"
    if not pointer.exists():
        return None
    path = Path(checkpoint_dir) / pointer.read_text().strip()
    why = problem(path)
    if why is not None:
        raise damaged(path, why, latest=True)
    return path


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
    """The ``config.json`` of a checkpoint: the run's and the model's config, global batch, layout, step; read
    only once its seal holds (`marin_train.seal.read_sealed`)."""
    path = Path(path)
    if not path.is_dir():
        raise damaged(path, problem(path))
    if not (path / "config.json").is_file():
        raise damaged(path, "has no config.json")
    try:
        config = json.loads(read_sealed(path, "config.json"))
    except ValueError as e:
        if isinstance(e, CheckpointDamagedError):
            raise
        raise damaged(path, "is damaged: config.json is not JSON") from None
    if not isinstance(config, dict) or not isinstance(config.get("global_batch"), int):
        raise damaged(path, "is damaged: config.json is not a checkpoint's config")
    return config


# Settings of a checkpoint's stream a resume keeps, with the flag that sets each: the windows and the held-out
# split follow them. The loader's fingerprint covers them too, but names no flag (a checkpoint without one: the
# default).
_KEPT = (("packing", "--packing"), ("val_fraction", "--val-fraction"))


def _check_kept(cfg: TrainConfig, recorded: dict[str, Any], previous: Path) -> None:
    """Refuse a resume whose packing or held-out fraction is not its checkpoint's, naming the flag: checked
    here, whatever the loader's fingerprint may let pass (``--mixture-from`` resumes without it)."""
    data = recorded.get("train", {}).get("data") or {}
    for field, flag in _KEPT:
        ours, theirs = getattr(cfg.data, field), data.get(field, getattr(DataConfig(), field))
        if ours != theirs:
            raise LoaderStateMismatchError(
                f"was trained with {flag} {theirs}, this run has {flag} {ours}: its windows and held-out split "
                f"follow it, so the run would not continue the stream it trained on; resume with {flag} {theirs}, "
                "or start afresh (--no-resume, or another --checkpoint-dir)", path=str(previous), expected=theirs,
                actual=ours)


def resume_config(cfg: TrainConfig, world: int) -> TrainConfig:
    """``cfg`` with the per-rank batch that keeps the global batch of the checkpoint a run resumes from (the
    global batch is part of the checkpoint), unchanged when there is none. Raises ValueError when that global
    batch does not divide over ``world`` ranks x ``cfg.accumulation`` micro-batches, and
    `LoaderStateMismatchError` when the checkpoint's packing or held-out fraction is not ``cfg``'s."""
    previous = latest_checkpoint(cfg.checkpoint_dir)
    if previous is None:
        return cfg
    recorded = checkpoint_config(previous)
    _check_kept(cfg, recorded, previous)
    global_batch = recorded["global_batch"]
    per_rank, rest = divmod(global_batch, world * cfg.accumulation)
    if rest or not per_rank:
        raise ValueError(f"{previous}: the global batch of {global_batch} sequences does not divide over {world} "
                         f"ranks x {cfg.accumulation} micro-batches; choose --accumulation so that it does")
    return replace(cfg, batch_size=per_rank)


def restore_loader(path: str | os.PathLike, data: Batches, *, strict: bool = True) -> None:
    """Only the loader position of a checkpoint (`load_checkpoint` with ``data`` restores it too): a trainer
    that knows where its stream continues can start fetching those shards before it builds the model."""
    checkpoint_config(path)  # refuses what is not a checkpoint of this version, naming it
    trainer = trainer_state(Path(path))
    data.load_state_dict(trainer["loader"], **({} if strict else {"strict": False}))


def load_checkpoint(path: str | os.PathLike, *, model: Transformer, optimizer: torch.optim.Optimizer,
                    data: Batches | None = None, global_batch: int | None = None, strict_data: bool = True) -> int:
    """Restore what `save_checkpoint` wrote into the sharded ``model``, ``optimizer`` and ``data``, at any
    world size or EP degree; return its step. ``global_batch``, when given, must be the checkpoint's.
    ``strict_data=False`` lets the loader continue a stream whose description changed (a new mixture phase).

    Every file is first checked against the seal (the ranks share the hashing): a damaged checkpoint raises
    `CheckpointDamagedError` naming its files. Then ``metrics.jsonl`` beside it is restored to the lines of
    the steps up to this checkpoint's (see `_restore_metrics`)."""
    path = Path(path)
    config = checkpoint_config(path)
    if global_batch is not None and global_batch != config["global_batch"]:
        raise ValueError(f"{path} was trained with a global batch of {config['global_batch']} sequences, this run "
                         f"has {global_batch}: set the per-rank batch with marin_train.checkpoint.resume_config")
    rank, world = dist.get_rank(), dist.get_world_size()
    verify(path, rank, world)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    load_shards(path, state)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    trainer = trainer_state(path)
    if data is not None:
        data.load_state_dict(trainer["loader"], **({} if strict_data else {"strict": False}))
    try:
        _set_rng_state(trainer["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:  # plain values, but not RNG states
        raise damaged(path, f"is damaged: trainer.pt holds no RNG state this process takes ({e})") from None
    if rank == 0 and "records" in trainer:  # format 2 kept no metrics
        _restore_metrics(path.parent / METRICS, trainer["records"], int(trainer["step"]))
    return int(trainer["step"])
