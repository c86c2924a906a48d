"""A checkpoint as one model file, and any saved model back on one process for evaluation and sampling.

`export_checkpoint` writes ``model.safetensors`` (whole tensors) and ``config.json`` (the ModelConfig): how
checkpoints are shared on the Hugging Face Hub, loadable without a process group or this package's training
side (`load_exported`, or any safetensors reader). Beside them go ``training.json`` (the run's TrainConfig and
step, which say how it was trained: sequence length, held-out fraction) and ``tokenizer.json`` when the run
recorded its corpus's tokenizer. DCP reassembles every sharded tensor, the routed experts at their global
shape, on one process.

`load_model` takes what a user has at hand: a checkpoint (``step-NNNNNNNN/``), a run directory (its
``latest`` checkpoint) or an exported model.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from marin_data.errors import CheckpointDamagedError, InvalidCheckpointError
from marin_data.layout import TOKENIZER
from marin_model.config import ModelConfig
from marin_model.model import Transformer
from marin_train.checkpoint import atomic_write, checkpoint_config, latest_checkpoint
from marin_train.safe_load import load_shards
from marin_train.seal import verify_checkpoint

__all__ = ["SavedModel", "TRAINING", "checkpoint_model", "export_checkpoint", "load_exported", "load_model"]

MODEL_FILE = "model.safetensors"
CONFIG = "config.json"
TRAINING = "training.json"  # an export's record of its run: {"step": N, "train": TrainConfig as a dict}


def checkpoint_model(checkpoint: str | os.PathLike) -> Transformer:
    """The whole model of a checkpoint directory on the CPU, read without a process group. A checkpoint whose
    files are not the ones its seal names is refused (`CheckpointDamagedError`)."""
    config = checkpoint_config(checkpoint)
    verify_checkpoint(checkpoint)
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_dict(config["model"]))
    state = {"model": {name: torch.empty_like(t, device="cpu") for name, t in model.state_dict().items()}}
    with warnings.catch_warnings():  # that no_dist=True ignores a process group this process may have joined
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        load_shards(Path(checkpoint), state, no_dist=True)
    model = Transformer(ModelConfig.from_dict(config["model"]))
    model.load_state_dict(state["model"])
    return model


def export_checkpoint(checkpoint: str | os.PathLike, to: str | os.PathLike) -> Path:
    """Write ``to/model.safetensors``, ``to/config.json``, ``to/training.json`` (and ``to/tokenizer.json``
    when the run recorded one) from a checkpoint directory; returns ``to``."""
    config = checkpoint_config(checkpoint)
    tensors = {name: t.contiguous() for name, t in checkpoint_model(checkpoint).state_dict().items()}
    to = Path(to)
    to.mkdir(parents=True, exist_ok=True)
    atomic_write(to / MODEL_FILE, lambda f: f.write(save(tensors, metadata={"format": "pt"})))
    atomic_write(to / CONFIG, lambda f: f.write(json.dumps(config["model"], indent=1).encode()))
    training = {"step": config["step"], "train": config["train"]}
    atomic_write(to / TRAINING, lambda f: f.write(json.dumps(training, indent=1).encode()))
    tokenizer = Path(checkpoint).parent / TOKENIZER
    if tokenizer.is_file():
        atomic_write(to / TOKENIZER, lambda f: shutil.copyfileobj(tokenizer.open("rb"), f))
    return to


def load_exported(directory: str | os.PathLike) -> Transformer:
    """The `Transformer` that `export_checkpoint` wrote to ``directory``, on the CPU, in eval mode."""
    directory = Path(directory)
    model = Transformer(ModelConfig.from_dict(json.loads((directory / CONFIG).read_text())))
    model.load_state_dict(load_file(directory / MODEL_FILE))
    return model.eval()


@dataclass(frozen=True)
class SavedModel:
    """A model loaded for inference, with what its run recorded."""

    model: Transformer  # whole, on the CPU, in eval mode
    path: Path  # the checkpoint or exported directory it was read from
    step: int | None  # the optimizer step it was saved at (None: not recorded)
    train: dict[str, Any] = field(default_factory=dict)  # the run's TrainConfig as saved ({}: not recorded)
    tokenizer: Path | None = None  # the training corpus's tokenizer.json, when the run recorded it


def load_model(path: str | os.PathLike) -> SavedModel:
    """Load a checkpoint directory, a run directory (its ``latest`` checkpoint) or an exported model.

    Raises:
        InvalidCheckpointError: ``path`` is none of those, or its files cannot be read.
    """
    path = Path(path)
    try:
        if (path / MODEL_FILE).is_file():
            training = json.loads((path / TRAINING).read_text()) if (path / TRAINING).is_file() else {}
            return SavedModel(load_exported(path), path, training.get("step"), training.get("train", {}),
                              _tokenizer(path))
        if (path / "latest").is_file():
            path = latest_checkpoint(path)
        if not (path / CONFIG).is_file() or not (path / ".metadata").is_file():
            raise InvalidCheckpointError("not a checkpoint (step-NNNNNNNN/ with config.json and .metadata), a run "
                                         "directory (with latest) or an exported model (with model.safetensors)",
                                         path=str(path))
        config = checkpoint_config(path)
        return SavedModel(checkpoint_model(path).eval(), path, config["step"], config["train"],
                          _tokenizer(path.parent))
    except (OSError, ValueError, KeyError, RuntimeError) as e:  # a torn or foreign file, a missing key
        if isinstance(e, (InvalidCheckpointError, CheckpointDamagedError)):
            raise
        raise InvalidCheckpointError(f"cannot be read as a model: {type(e).__name__}: {e}", path=str(path)) from e


def _tokenizer(directory: Path) -> Path | None:
    return directory / TOKENIZER if (directory / TOKENIZER).is_file() else None
