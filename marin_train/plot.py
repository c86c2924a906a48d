"""``marin-train plot RUN``: one PNG of a run's ``metrics.jsonl`` against steps (bottom axis) and tokens (top).

Four panels: training loss (and held-out loss, ``eval/loss`` and ``eval/<subset>/loss``, where the run
evaluated), learning rate, throughput (tokens/s), expert load (the busiest expert over the mean, per MoE
layer thin and their mean thick). Drawn on matplotlib's Agg canvas (no pyplot, no display), so it runs on a
headless node; `plot_run` returns the figure, whose lines hold exactly the data plotted.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np

from marin_train.checkpoint import atomic_write
from marin_train.metrics import read_metrics

__all__ = ["plot_path", "plot_run"]

_EVAL_LOSS = re.compile(r"^eval/(?:.+/)?loss$")  # eval/loss (overall) and eval/<subset>/loss
_LAYER_LOAD = re.compile(r"^moe/layer\d+/max_over_mean$")


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of ``key`` on the records that carry it."""
    rows = [(r["step"], r[key]) for r in records if key in r]
    return np.array([s for s, _ in rows], dtype=float), np.array([v for _, v in rows], dtype=float)


def plot_path(run: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Where `plot_run` writes: ``out``, else ``metrics.png`` beside the run's ``metrics.jsonl``."""
    if out is not None:
        return Path(out)
    return (Path(run) if Path(run).is_dir() else Path(run).parent) / "metrics.png"


def plot_run(run: str | os.PathLike, out: str | os.PathLike | None = None):
    """Plot ``run`` (a checkpoint directory, or its ``metrics.jsonl``) into ``out`` (default
    ``RUN/metrics.png``); returns the matplotlib ``Figure``.

    Raises:
        FileNotFoundError: no metrics file; ValueError: a malformed line, or no records.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(run)
    if not records:
        raise ValueError(f"{run}: the metrics file holds no records yet (they are written at each checkpoint)")
    source, out = Path(run), plot_path(run, out)
    steps = [r["step"] for r in records]
    seen = records[-1].get("tokens_seen", steps[-1] * records[-1]["tokens"])

    fig = Figure(figsize=(9, 10), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    loss, lr, speed, load = fig.subplots(4, 1, sharex=True)
    loss.plot(*_series(records, "loss"), label="train loss", color="C0")
    for i, key in enumerate(sorted({k for r in records for k in r if _EVAL_LOSS.match(k)})):
        loss.plot(*_series(records, key), "o-", label=key, color=f"C{i + 1}", markersize=3)
    loss.set_ylabel("loss (nats/token)")
    loss.legend(loc="upper right", fontsize=8)
    lr.plot(*_series(records, "lr"), color="C0")
    lr.set_ylabel("learning rate")
    speed.plot(*_series(records, "tokens_per_s"), color="C0")
    speed.set_ylabel("tokens/s")
    for key in sorted({k for r in records for k in r if _LAYER_LOAD.match(k)}):
        load.plot(*_series(records, key), linewidth=0.6, alpha=0.5, label=key.split("/")[1])
    load.plot(*_series(records, "imbalance"), color="black", linewidth=1.8, label="mean over layers")
    load.set_ylabel("expert load: max / mean")
    load.set_xlabel("step")
    load.legend(loc="upper right", fontsize=7, ncol=4)
    # Tokens on the top axis: steps times the tokens of a step (a resume keeps the global batch, so a run's
    # steps all hold the same number of tokens).
    per_step = float(records[-1]["tokens"])
    top = loss.secondary_xaxis("top", functions=(lambda s: s * per_step, lambda t: t / per_step))
    top.set_xlabel("tokens")
    for ax in (loss, lr, speed, load):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{source}: steps {steps[0]}-{steps[-1]}, {seen:,} tokens")
    out.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    atomic_write(out, lambda f: f.write(png.getvalue()))
    return fig
