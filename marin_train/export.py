"""A checkpoint as one model file: ``model.safetensors`` (whole tensors) and ``config.json`` (the ModelConfig).

That is how checkpoints are shared on the Hugging Face Hub, and what one process loads without a process
group or this package's training side: `load_exported` (or any safetensors reader). DCP reassembles every
sharded tensor, the routed experts at their global shape, on one process.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save

from marin_model.config import ModelConfig
from marin_model.model import Transformer
from marin_train.checkpoint import atomic_write, checkpoint_config, verify_checkpoint

__all__ = ["export_checkpoint", "load_exported"]


def export_checkpoint(checkpoint: str | os.PathLike, to: str | os.PathLike) -> Path:
    """Write ``to/model.safetensors`` and ``to/config.json`` from a checkpoint directory; returns ``to``.
    A checkpoint whose files are not the ones its seal names is refused (`CheckpointDamagedError`)."""
    config = checkpoint_config(checkpoint)
    verify_checkpoint(checkpoint)
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_dict(config["model"]))
    state = {"model": {name: torch.empty_like(t, device="cpu") for name, t in model.state_dict().items()}}
    with warnings.catch_warnings():  # no process group is the point of exporting: torch warns it assumes one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=checkpoint, no_dist=True)
    to = Path(to)
    to.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.contiguous() for name, t in state["model"].items()}
    atomic_write(to / "model.safetensors", lambda f: f.write(save(tensors, metadata={"format": "pt"})))
    atomic_write(to / "config.json", lambda f: f.write(json.dumps(config["model"], indent=1).encode()))
    return to


def load_exported(directory: str | os.PathLike) -> Transformer:
    """The `Transformer` that `export_checkpoint` wrote to ``directory``, on the CPU, in eval mode."""
    directory = Path(directory)
    model = Transformer(ModelConfig.from_dict(json.loads((directory / "config.json").read_text())))
    model.load_state_dict(load_file(directory / "model.safetensors"))
    return model.eval()
