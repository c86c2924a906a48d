"""The seal of a checkpoint: ``seal.json`` records the step and each file's size and sha256.

`seal_document` hashes the files of a checkpoint just written, all ranks in parallel (each its own ``.distcp``
files); `verify` re-hashes them the same way before a load and refuses a checkpoint whose files are not the
sealed ones, naming each; `read_sealed` reads one small file (``config.json``, ``trainer.pt``) once, hashes
those bytes and hands them out only if they are the sealed ones, so nothing of a checkpoint is parsed before
its seal holds. `problem` is the quick look (sizes only) that `latest` gets; `damaged` builds the error,
offering the newest intact checkpoint beside. Checkpoints of format 2 have no seal and pass unchecked.

The seal is no signature: whoever can write the checkpoint can seal their own files. It catches damage and
mix-ups; what keeps a forged checkpoint from running code is that nothing in it is unpickled beyond tensors
and plain values (`marin_train.safe_load`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch.distributed as dist

from marin_data.fileio.atomic import sha256_file
from marin_data.errors import CheckpointDamagedError

__all__ = ["CHECKPOINT_FORMAT", "SEAL", "damaged", "problem", "read_sealed", "seal_document", "verify",
           "verify_checkpoint"]

CHECKPOINT_FORMAT = 3  # 3: sealed, with its steps' metrics; 2: unsealed (still loads, unchecked)
SEAL = "seal.json"
STEP = re.compile(r"step-(\d{8})")
_DISTCP = re.compile(r"__(\d+)_\d+\.distcp")  # DCP's name for the n-th data file rank R writes


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


def seal_document(part: Path, step: int, rank: int, world: int) -> dict[str, Any] | None:
    """What ``part/seal.json`` holds: the step and every file's size and sha256 (all ranks hash; rank 0 gets
    the document, the others None).

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
    if rank != 0:
        return None
    files = {n: {"bytes": found[n][1], "sha256": found[n][0]} for n in sorted(sizes)}
    return {"format": CHECKPOINT_FORMAT, "step": step, "files": files}


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


def _unsealed(path: Path) -> bool:
    """Whether ``path`` is a checkpoint of format 2, which has no seal (and so nothing to check against)."""
    return not (path / SEAL).exists() and _format_of(path) == 2


def problem(path: Path) -> str | None:
    """What a quick look finds wrong with the checkpoint ``path`` (a missing step, no seal, a sealed file
    missing or of another size), or None; only a load hashes the files. A format-2 checkpoint has no seal."""
    if path.is_file():
        return ("is a single-file checkpoint: the single-file checkpoints (step-NNNNNNNN.pt) of earlier versions "
                "cannot be loaded (load them with the version that wrote them)")
    if not path.is_dir():
        return "does not exist"
    seal = _read_seal(path)
    if isinstance(seal, str):
        return None if _unsealed(path) else seal
    for name, sealed in seal["files"].items():
        try:
            size = os.stat(path / name).st_size
        except OSError:
            return f"is damaged: {name} is missing"
        if size != sealed["bytes"]:
            return f"is damaged: {name} holds {size} bytes, its seal says {sealed['bytes']}"
    return None


def damaged(path: Path, why: str, *, latest: bool = False) -> CheckpointDamagedError:
    """The error for a checkpoint found missing or damaged, offering the newest other one that looks intact."""
    root = path.parent
    intact = [p.name for p in sorted(root.glob("step-*"), reverse=True)
              if p.name != path.name and STEP.fullmatch(p.name) and problem(p) is None]
    if intact:
        fix = (f"the newest intact checkpoint is {intact[0]} (its files are hashed as it loads): to resume from "
               f"it, write its name into {root / 'latest'} (echo {intact[0]} > {root / 'latest'}); or start "
               "afresh with --no-resume")
    else:
        fix = f"no intact checkpoint is left in {root}: start afresh with --no-resume"
    what = f"latest names {path.name}, which" if latest else "the checkpoint"
    return CheckpointDamagedError(f"{what} {why}\n  -> {fix}", path=str(root if latest else path))


def read_sealed(path: Path, name: str) -> bytes:
    """The bytes of the file ``name`` of the checkpoint ``path``, read once and handed out only when they are
    the ones its seal names (those of a format-2 checkpoint as they are). Raises `CheckpointDamagedError`
    naming the file otherwise."""
    seal = _read_seal(path)
    if isinstance(seal, str):
        if not _unsealed(path):
            raise damaged(path, seal)
        sealed = None
    elif name not in seal["files"]:
        raise damaged(path, f"is damaged: {name} is not sealed")
    else:
        sealed = seal["files"][name]
    try:
        with open(path / name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if sealed is not None and size != sealed["bytes"]:
                raise damaged(path, f"is damaged: {name} holds {size} bytes, its seal says {sealed['bytes']}")
            data = f.read(size)
    except OSError as e:
        raise damaged(path, f"is damaged: {name} " + ("is missing" if isinstance(e, FileNotFoundError)
                                                       else f"cannot be read ({e.strerror})")) from e
    digest = None if sealed is None else hashlib.sha256(data).hexdigest()
    if sealed is not None and (digest, len(data)) != (sealed["sha256"], sealed["bytes"]):
        raise damaged(path, f"is damaged: {name} has sha256 {digest} ({len(data)} bytes), its seal says "
                            f"{sealed['sha256']} ({sealed['bytes']} bytes)")
    return data


def verify(path: Path, rank: int, world: int) -> None:
    """Raise `CheckpointDamagedError` unless every file sealed in ``path`` has its sealed size and sha256 and
    the seal's step is the directory's (a collective when ``world > 1``: the ranks share the hashing)."""
    seal = _read_seal(path)
    if isinstance(seal, str):
        if not _unsealed(path):
            raise damaged(path, seal)
        return  # format 2: nothing to check against
    named = STEP.fullmatch(path.name)
    if named and int(named.group(1)) != seal["step"]:
        raise damaged(path, f"holds step {seal['step']}'s checkpoint, not step {int(named.group(1))}'s")
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
        raise damaged(path, "is damaged: " + "; ".join(bad))


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Check, in this one process, that every file of the checkpoint ``path`` is the one its seal names.

    Raises `CheckpointDamagedError` naming each file that is missing or differs, and the newest intact
    checkpoint beside it. (`load_checkpoint` runs the same check with the hashing shared by the ranks.)"""
    verify(Path(path), 0, 1)
