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

Sealed: once every rank's files are written, ``seal.json`` records the step and each file's size and
sha256, hashed by all ranks in parallel (each its own ``.distcp`` files). A load re-hashes them the same way
and refuses a checkpoint whose files are not the sealed ones, naming each; ``latest`` naming a missing or
unsealed step is refused with the newest intact checkpoint offered. ``trainer.pt`` keeps the metrics of
the steps since the previous checkpoint, so a resume restores ``metrics.jsonl`` to exactly the lines of the
steps up to its own (a kill after the commit and before the append lost none).

Checkpoints of format 2 (no seal) still load, unchecked. The single-file checkpoints of earlier versions
(``step-NNNNNNNN.pt``, one ``torch.save`` by rank 0) are not loadable: resuming from one raises, naming it.
"""

from __future__ import annotations

import json
import os
import random
import re
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

from marin_data.atomic import sha256_file
from marin_data.errors import CheckpointDamagedError
from marin_model.model import Transformer
from marin_train.config import TrainConfig

__all__ = ["Batches", "CHECKPOINT_FORMAT", "SEAL", "atomic_write", "checkpoint_config", "latest_checkpoint",
           "load_checkpoint", "prune_checkpoints", "resolve_checkpoint", "restore_loader", "resume_config",
           "save_checkpoint", "verify_checkpoint"]

CHECKPOINT_FORMAT = 3  # 3: sealed, with its steps' metrics; 2: unsealed (still loads, unchecked)
SEAL = "seal.json"
METRICS = "metrics.jsonl"
_STEP = re.compile(r"step-(\d{8})")
_DISTCP = re.compile(r"__(\d+)_\d+\.distcp")  # DCP's name for the n-th data file rank R writes


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
                    log: Callable[[str], None] = lambda line: None,
                    lr_schedule: Mapping[str, float] | None = None) -> str:
    """Write ``step-NNNNNNNN/`` (all ranks, each its shards), seal it (all ranks) and then point ``latest`` at
    it (rank 0), keep the newest ``cfg.keep_checkpoints`` (`prune_checkpoints`; ``log`` names each one
    deleted), and append ``records`` (the metrics of the steps since the previous checkpoint, kept in the
    checkpoint too) to ``metrics.jsonl``. Returns its path.

    The RNG states saved are rank 0's: the ranks draw the same stream (same seed, no per-rank draws).
    ``lr_schedule``: the learning-rate schedule the run follows (`marin_train.loop.lr_schedule`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    root = Path(cfg.checkpoint_dir)
    name = f"step-{step:08d}"
    final, part = root / name, root / f".{name}.part"
    records = list(records)
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
        trainer = {"format": CHECKPOINT_FORMAT, "step": step, "loader": data.state_dict(), "rng": _rng_state(),
                   "records": records}
        config = {"format": CHECKPOINT_FORMAT, "step": step, "world_size": world, "ep": cfg.ep,
                  "global_batch": cfg.global_batch(world), "train": asdict(cfg), "model": asdict(model.cfg),
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


# --- the seal ------------------------------------------------------------------------------------------


def _share(sizes: dict[str, int], rank: int, world: int) -> list[str]:
    """The files ``rank`` hashes: each rank's own ``.distcp`` files (still in its page cache after a save, on
    its own node), the rest spread so that every rank reads about as many bytes. The same on every rank."""
    load, mine = [0] * world, []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        owner = _DISTCP.fullmatch(name)
        r = int(owner.group(1)) if owner and int(owner.group(1)) < world else load.index(min(load))
        load[r] += sizes[name]
        if r == rank:
            mine.append(name)
    return mine


def _hashes(directory: Path, sizes: dict[str, int], rank: int, world: int) -> dict[str, tuple[str, int] | str]:
    """``{name: (sha256, bytes)}`` of the files named in ``sizes``, or a reason one cannot be read: each rank
    hashes its `_share` and the ranks exchange what they found (a collective when ``world > 1``)."""
    mine: dict[str, tuple[str, int] | str] = {}
    for name in _share(sizes, rank, world):
        try:
            mine[name] = sha256_file(directory / name)
        except OSError as e:  # reported, so that every rank still joins the exchange
            mine[name] = "is missing" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror})"
    if world == 1:
        return mine
    every: list[dict | None] = [None] * world
    dist.all_gather_object(every, mine)
    return {name: found for part in every for name, found in part.items()}


def _seal(part: Path, step: int, rank: int, world: int) -> None:
    """Write ``part/seal.json``: the step and every file's size and sha256 (all ranks hash, rank 0 writes).

    Rank 0 lists the folder once every rank's files are in (`dcp.save` returns on rank 0 after all ranks
    reported their writes, and its own files come next) and hands the list to the others, so every rank
    hashes from the same listing."""
    listing = [{e.name: e.stat().st_size for e in os.scandir(part) if e.is_file(follow_symlinks=False)}
               if rank == 0 else None]
    if world > 1:
        dist.broadcast_object_list(listing, src=0)
    sizes = listing[0]
    found = _hashes(part, sizes, rank, world)
    bad = {n: f for n, f in found.items() if isinstance(f, str) or f[1] != sizes[n]}
    if bad:  # a file changed between the listing and its hash (every rank sees it): nothing is committed
        raise CheckpointDamagedError(f"files changed while being sealed: {bad}", path=str(part))
    if rank == 0:
        files = {n: {"bytes": found[n][1], "sha256": found[n][0]} for n in sorted(sizes)}
        seal = {"format": CHECKPOINT_FORMAT, "step": step, "files": files}
        atomic_write(part / SEAL, lambda f: f.write(json.dumps(seal, indent=1).encode()))


def _read_seal(path: Path) -> dict[str, Any] | str:
    """The seal of the checkpoint ``path``, or what is wrong with it: missing, unreadable, not a seal."""
    try:
        seal = json.loads((path / SEAL).read_bytes())
        files = seal["files"]
        if not isinstance(seal["step"], int) or not all(
                isinstance(f["bytes"], int) and isinstance(f["sha256"], str) for f in files.values()):
            raise TypeError
        if not all(isinstance(n, str) and n not in ("", ".", "..") and "/" not in n and "\0" not in n
                   for n in files):
            raise ValueError("a sealed name is not a file of the folder")  # nothing is read outside it
        return seal
    except FileNotFoundError:
        return f"has no seal ({SEAL}: a save that did not finish, or files removed)"
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return f"has an unreadable seal ({SEAL})"


def _format_of(path: Path) -> int | None:
    try:
        return int(json.loads((path / "config.json").read_bytes())["format"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _problem(path: Path) -> str | None:
    """What a quick look finds wrong with the checkpoint ``path`` (a missing step, no seal, a sealed file
    missing or of another size), or None; only a load hashes the files. A format-2 checkpoint has no seal."""
    if path.is_file():
        return ("is a single-file checkpoint: the single-file checkpoints (step-NNNNNNNN.pt) of earlier versions "
                "cannot be loaded (load them with the version that wrote them)")
    if not path.is_dir():
        return "does not exist"
    seal = _read_seal(path)
    if isinstance(seal, str):
        return None if not (path / SEAL).exists() and _format_of(path) == 2 else seal
    for name, sealed in seal["files"].items():
        try:
            size = os.stat(path / name).st_size
        except OSError:
            return f"is damaged: {name} is missing"
        if size != sealed["bytes"]:
            return f"is damaged: {name} holds {size} bytes, its seal says {sealed['bytes']}"
    return None


def _damaged(path: Path, why: str, *, latest: bool = False) -> CheckpointDamagedError:
    """The error for a checkpoint found missing or damaged, offering the newest other one that looks intact."""
    root = path.parent
    intact = [p.name for p in sorted(root.glob("step-*"), reverse=True)
              if p.name != path.name and _STEP.fullmatch(p.name) and _problem(p) is None]
    if intact:
        fix = (f"the newest intact checkpoint is {intact[0]} (its files are hashed as it loads): to resume from "
               f"it, write its name into {root / 'latest'} (echo {intact[0]} > {root / 'latest'}); or start "
               "afresh with --no-resume")
    else:
        fix = f"no intact checkpoint is left in {root}: start afresh with --no-resume"
    what = f"latest names {path.name}, which" if latest else "the checkpoint"
    return CheckpointDamagedError(f"{what} {why}\n  -> {fix}", path=str(root if latest else path))


def _verify(path: Path, rank: int, world: int) -> None:
    """Raise `CheckpointDamagedError` unless every file sealed in ``path`` has its sealed size and sha256 and
    the seal's step is the directory's (a collective when ``world > 1``: the ranks share the hashing)."""
    seal = _read_seal(path)
    if isinstance(seal, str):
        if (path / SEAL).exists() or _format_of(path) != 2:
            raise _damaged(path, seal)
        return  # format 2: nothing to check against
    named = _STEP.fullmatch(path.name)
    if named and int(named.group(1)) != seal["step"]:
        raise _damaged(path, f"holds step {seal['step']}'s checkpoint, not step {int(named.group(1))}'s")
    found = _hashes(path, {n: f["bytes"] for n, f in seal["files"].items()}, rank, world)
    bad = []
    for name, sealed in sorted(seal["files"].items()):
        got = found[name]
        if isinstance(got, str):
            bad.append(f"{name} {got}")
        elif got != (sealed["sha256"], sealed["bytes"]):
            bad.append(f"{name} has sha256 {got[0]} ({got[1]} bytes), its seal says {sealed['sha256']} "
                       f"({sealed['bytes']} bytes)")
    if bad:
        raise _damaged(path, "is damaged: " + "; ".join(bad))


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Check, in this one process, that every file of the checkpoint ``path`` is the one its seal names.

    Raises `CheckpointDamagedError` naming each file that is missing or differs, and the newest intact
    checkpoint beside it. (`load_checkpoint` runs the same check with the hashing shared by the ranks.)"""
    _verify(Path(path), 0, 1)


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
    problem = _problem(path)
    if problem is not None:
        raise _damaged(path, problem, latest=True)
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
    """The ``config.json`` of a checkpoint: the run's and the model's config, global batch, layout, step."""
    path = Path(path)
    if not path.is_dir():
        raise _damaged(path, _problem(path))
    if not (path / "config.json").is_file():
        raise _damaged(path, "has no config.json")
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
    _verify(path, rank, world)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    trainer = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    if data is not None:
        data.load_state_dict(trainer["loader"], **({} if strict_data else {"strict": False}))
    _set_rng_state(trainer["rng"])
    if rank == 0 and "records" in trainer:  # format 2 kept no metrics
        _restore_metrics(path.parent / METRICS, trainer["records"], int(trainer["step"]))
    return int(trainer["step"])
