"""Reading a checkpoint's pickled parts without running code from it.

A checkpoint holds three kinds of pickle: DCP's ``.metadata`` (which torch reads with a plain
``pickle.load``), the non-tensor values DCP stores in the ``.distcp`` files (which torch's default planner
reads with ``torch.load(weights_only=False)``) and ``trainer.pt``. Anyone who can write a checkpoint can
also seal it (`marin_train.seal`), so a pickle there is untrusted input even when its seal holds: here
``.metadata`` is read by an unpickler that builds only the types DCP's metadata holds, and every other
pickle with ``torch.load(weights_only=True)`` (tensors and plain values). A checkpoint that needs anything
else is refused by name (`CheckpointDamagedError`), its code never run.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from marin_data.errors import shown
from marin_data.ui import printable
from marin_train.seal import damaged, read_sealed

__all__ = ["TRAINER", "load_shards", "trainer_state"]

TRAINER = "trainer.pt"
_DCP = "torch.distributed.checkpoint"
# Every type DCP's .metadata holds (torch 2.13): dataclasses, an enum, paths, torch's sizes, dtypes and layouts.
_METADATA_TYPES = {(f"{_DCP}.metadata", n) for n in (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")} | {
    (f"{_DCP}.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"), ("torch", "Size"),
    ("torch.serialization", "_get_layout")} | {
    ("torch", n) for n, v in vars(torch).items() if isinstance(v, torch.dtype)}
# What trainer.pt of earlier versions holds beyond plain values: numpy's RNG state, an array of uint32, which
# pickles as a call of numpy's array constructor (named numpy.core.multiarray before numpy 2).
_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]
_NUMPY_STATE = [_RECONSTRUCT, (_RECONSTRUCT, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
                type(np.dtype(np.uint32))]


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata and nothing else: any other global a pickle names is refused before it is
    looked up, so no function of the pickle's choosing is ever called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_TYPES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"names {shown(f'{module}.{name}')}, which no checkpoint's metadata holds")


class _Reader(FileSystemReader):
    """DCP's reader, handing DCP the metadata `load_shards` read with `_MetadataUnpickler` (DCP's own reader
    would ``pickle.load`` it, and log a traceback for each way it failed)."""

    def __init__(self, path: Path, metadata: Metadata):
        super().__init__(path)
        self.metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.metadata.storage_meta is None:
            self.metadata.storage_meta = StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


class _Planner(DefaultLoadPlanner):
    """DCP's planner, with the non-tensor values of a state (an optimizer's hyperparameters) read with
    ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            plain = torch.load(value, weights_only=True)
        except Exception as e:  # noqa: BLE001 - whatever torch makes of foreign bytes, the value is named
            raise ValueError(f"the value of {fqn} is not a plain value ({_why(e)})") from None
        if self.flatten_state_dict:  # the rest as DefaultLoadPlanner.load_bytes does it
            set_element(self.original_state_dict, self.mappings[fqn], plain)
        else:
            self.state_dict[fqn] = plain


def _metadata(path: Path) -> Metadata:
    """DCP's ``.metadata`` of the checkpoint ``path``, built by `_MetadataUnpickler`."""
    try:
        with open(path / ".metadata", "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except Exception as e:  # noqa: BLE001 - a truncated or foreign pickle fails in many ways; all are named
        raise damaged(path, f"is damaged: .metadata cannot be read as DCP's metadata ({_why(e)})") from None
    if not isinstance(metadata, Metadata):
        raise damaged(path, f"is damaged: .metadata holds a {type(metadata).__name__}, not DCP's metadata")
    return metadata


def load_shards(path: Path, state: dict[str, Any], *, no_dist: bool = False) -> None:
    """`dcp.load` of ``state`` from the checkpoint ``path`` (`dcp.load`'s ``no_dist``), nothing unpickled but
    DCP's metadata types, tensors and plain values. Raises `CheckpointDamagedError` naming what cannot be
    read that way (DCP's own `CheckpointException` is no ``Exception``, so it would pass every handler)."""
    reader = _Reader(path, _metadata(path))
    try:
        dcp.load(state, storage_reader=reader, planner=_Planner(), no_dist=no_dist)
    except CheckpointException as e:
        errors = [failure[0] if isinstance(failure, tuple) else failure for failure in e.failures.values()]
        what = "; ".join(sorted({_why(x) for x in errors}))
        raise damaged(path, f"is damaged: {what}") from None


def _why(error: BaseException) -> str:
    """What ``error`` says in one short line: for torch's refusal of a pickle, the global it refused."""
    text = str(error)
    text = text.partition("WeightsUnpickler error:")[2] or text
    line = text.strip().splitlines()[0].split(". ")[0] if text.strip() else type(error).__name__
    return printable(line if len(line) <= 200 else line[:200] + "...")


def trainer_state(path: Path) -> dict[str, Any]:
    """``trainer.pt`` of the checkpoint ``path`` (loader position, RNG states, step, metrics), read only once
    its seal holds, and then with ``weights_only=True``. Raises `CheckpointDamagedError` naming it when it is
    not the sealed file or does not hold a trainer's state."""
    data = read_sealed(path, TRAINER)
    try:
        with torch.serialization.safe_globals(_NUMPY_STATE):
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever torch makes of foreign bytes, the file is named
        raise damaged(path, f"is damaged: {TRAINER} cannot be read as a trainer's state ({_why(e)})") from None
    rng = state.get("rng") if isinstance(state, dict) else None
    if not (isinstance(rng, dict) and isinstance(state.get("step"), int) and isinstance(state.get("loader"), dict)
            and isinstance(rng.get("torch"), torch.Tensor) and isinstance(rng.get("numpy"), (tuple, list))
            and isinstance(rng.get("python"), tuple) and isinstance(state.get("records", []), list)):
        raise damaged(path, f"is damaged: {TRAINER} does not hold a trainer's state (step, loader, rng)")
    return state
