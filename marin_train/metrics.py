"""A run's per-step metrics record and where it goes: ``metrics.jsonl``, TensorBoard, Weights & Biases.

Every optimizer step makes one record, a flat dict of numbers (`FIELDS` says what each means and its unit).
``metrics.jsonl`` in the checkpoint directory gets one JSON object per line per step; the records since the
previous checkpoint are appended when a checkpoint is written, so after a crash and a resume every step is
there exactly once, in order, across all the runs that continued it (the steps after the last checkpoint
of a crashed run are run again and recorded then). TensorBoard (``--tensorboard DIR``) and W&B (``--wandb
PROJECT``) get each record as it is made, from rank 0; they are optional extras (``pip install
'marin[tensorboard]'``, ``'marin[wandb]'``). Fields outside the core table are named ``group/name``
(``moe/layer03/idle_experts``, ``eval/loss``, ``eval/<subset>/loss``): a group's fields appear on the steps
that compute them, and readers keep any field they do not know. The file format: docs/design.md, "Watching
a run".
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from marin_data.errors import MissingExtraError
from marin_train.checkpoint import atomic_write

__all__ = ["FIELDS", "MOE_FIELDS", "MetricsSinks", "METRICS_FILE", "moe_health", "read_metrics"]

METRICS_FILE = "metrics.jsonl"  # in the checkpoint directory

# The core fields of every record: name -> (unit, meaning).
FIELDS: dict[str, tuple[str, str]] = {
    "step": ("count", "optimizer steps done, this one included (1-based)"),
    "loss": ("nats/token", "the objective: cross-entropy plus the z-loss coefficient times z_loss; mean over "
                           "micro-batches and ranks"),
    "ce_loss": ("nats/token", "cross-entropy of the next token, mean over the step's tokens"),
    "z_loss": ("nats^2", "router z-loss before its coefficient, mean over layers (per layer: moe/layerNN/z_loss)"),
    "dropped": ("fraction", "token copies dropped by the experts' capacity limit, mean over layers (0 without "
                            "a capacity factor)"),
    "imbalance": ("ratio", "busiest expert's load over the mean load, mean over layers"),
    "lr": ("1", "learning rate of this step"),
    "grad_norm": ("1", "global L2 norm of the gradients before clipping"),
    "seconds": ("s", "wall time of the step, data wait included"),
    "data_wait": ("s", "time in the loader's next() during the step"),
    "tokens": ("tokens", "tokens in the step's global batch"),
    "tokens_seen": ("tokens", "tokens trained on up to and including this step (step x tokens)"),
    "tokens_per_s": ("tokens/s", "tokens / seconds, over all ranks"),
    "time_to_first_step": ("s", "only on the first step of each run (process): from the start of the run "
                                "(loader, model, checkpoint load) to the end of that step"),
}

# Per MoE layer NN (zero-padded, 0-based), as moe/layerNN/<name>: name -> (unit, meaning).
MOE_FIELDS: dict[str, tuple[str, str]] = {
    "max_over_mean": ("ratio", "the busiest expert's token copies over the mean per expert, over all ranks"),
    "idle_experts": ("count", "experts that received no token in the step, over all ranks"),
    "bias_spread": ("logit", "max - min of the balancing bias the step routed with"),
    "z_loss": ("nats^2", "mean over tokens of logsumexp(router logits)^2"),
    "dropped": ("fraction", "token copies over the capacity limit (0 without a capacity factor)"),
}


def moe_health(load_LE: np.ndarray, z_L: np.ndarray, dropped_L: np.ndarray,
               bias_spread_L: np.ndarray) -> dict[str, float]:
    """The ``moe/layerNN/*`` fields of a step from its global per-expert load [L,E] and per-layer z-loss,
    dropped fraction and bias spread [L] (host arrays: the step's one device-to-host copy has been made;
    numpy, because torch's per-op overhead on arrays this small is most of the cost)."""
    width = max(2, len(str(load_LE.shape[0] - 1)))
    ratio_L = load_LE.max(1) / np.maximum(load_LE.mean(1), 1e-9)
    idle_L = (load_LE == 0).sum(1)
    rows = np.stack([ratio_L, idle_L, bias_spread_L, z_L, dropped_L], 1).tolist()  # [L,5], MOE_FIELDS order
    return {f"moe/layer{i:0{width}d}/{name}": v for i, row in enumerate(rows) for name, v in zip(MOE_FIELDS, row)}


def read_metrics(run: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of ``run/metrics.jsonl`` (``run`` a checkpoint directory, or the file), in step order.

    Raises:
        FileNotFoundError: no metrics file there.
        ValueError: a line that is not a JSON object with a ``step``, named by its line number.
    """
    path = Path(run)
    path = path / METRICS_FILE if path.is_dir() else path
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError(f"{path}:{n}: not a metrics record (a JSON object with a step)")
            records.append(record)
    return records


def _require(module: str, extra: str, flag: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(f"{flag} needs {module}, which is not installed: pip install 'marin[{extra}]'")


class MetricsSinks:
    """Where rank 0 sends each record as it is made: TensorBoard event files and a W&B run, either optional.

    Args:
        tensorboard: a directory for TensorBoard's event files (a resumed run adds a file beside the others;
            TensorBoard reads them as one run).
        wandb: a W&B project. The run's id is kept in ``checkpoint_dir/wandb-run-id`` so that a resumed
            run continues the same W&B run; W&B's own settings apply (``WANDB_MODE=offline``, ``WANDB_DIR``).
        checkpoint_dir: the run's directory (W&B files go under it unless ``WANDB_DIR`` says otherwise).
        config: the run's configuration, recorded by W&B (store options by name only: they may hold
            credentials).

    Raises:
        MissingExtraError: the library a sink needs is not installed (the message names the pip command).
    """

    def __init__(self, *, tensorboard: str | None = None, wandb: str | None = None,
                 checkpoint_dir: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        if tensorboard:
            _require("tensorboard", "tensorboard", "--tensorboard")
        if wandb:
            _require("wandb", "wandb", "--wandb")
        self._tb = self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=tensorboard)
        if wandb:
            self._wandb = _wandb_run(wandb, checkpoint_dir, dict(config or {}))

    def write(self, record: Mapping[str, float]) -> None:
        step = int(record["step"])
        values = {k: v for k, v in record.items() if k != "step"}
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, global_step=step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def __enter__(self) -> MetricsSinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        self._tb = self._wandb = None


def _wandb_run(project: str, checkpoint_dir: str | None, config: dict[str, Any]):
    import wandb

    run_id = None
    id_file = Path(checkpoint_dir) / "wandb-run-id" if checkpoint_dir else None
    if id_file is not None and id_file.exists():
        run_id = id_file.read_text().strip()
    directory = os.environ.get("WANDB_DIR") or checkpoint_dir
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
    data = config.get("data")
    if isinstance(data, dict) and data.get("store_options"):  # may hold credentials: W&B gets their names only
        config = {**config, "data": {**data, "store_options": sorted(data["store_options"])}}
    run = wandb.init(project=project, id=run_id or uuid.uuid4().hex[:8], resume="allow", dir=directory,
                     config=config)
    if id_file is not None and run_id is None:
        id_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(id_file, lambda f: f.write(run.id.encode()))
    return run

