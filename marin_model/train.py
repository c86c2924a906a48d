"""The training loop: ``marin-train`` / ``python -m marin_model.train`` (issue 9).

This module imports nothing but torch and numpy (a GPU machine may lack boto3 and pyarrow): the data side
is passed in — any iterable of batches in the loader's contract (``input_ids``, ``labels``, ``segment_ids``,
``positions``) with ``state_dict()`` / ``load_state_dict()`` — and ``main`` imports `marin_data` lazily to
build one (`marin_data.training`).

One optimizer step:

1. ``accumulation`` micro-batches, each forward (bf16 autocast on CUDA; off on CPU by default, where it
   buys little and costs exactness) and backward of ``loss / accumulation``; the time spent waiting for the
   loader's ``next()`` is measured apart.
2. Under ``torch.distributed`` (``torchrun``; gloo on CPU, NCCL on GPU) the gradients are averaged with one
   all-reduce of a flat buffer — every rank then takes the same step from the same weights, so the weights
   stay identical without DDP's buffer broadcasts, which would clobber each rank's router load counts.
   Each rank reads its own slice of every global batch (the loader takes rank and world size from
   ``torch.distributed``).
3. Gradient clipping, AdamW (no weight decay on norms), a linear warmup then cosine learning rate.
4. The balancing bias moves from the *global* expert load of the step (`Transformer.update_router_bias`
   all-reduces it).

Checkpoints hold the model (with the balancing bias), the optimizer, the loader's state (the stream
position consumed), the RNG states and the step; they are written atomically (temporary file, fsync,
rename, then the ``latest`` pointer the same way), so a crash leaves the previous one intact. Resuming
continues bitwise: on CPU, 20 steps equal 10 steps + resume + 10 steps.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from marin_model.config import ModelConfig, get_preset, with_overrides
from marin_model.model import Transformer

__all__ = ["DataConfig", "TrainConfig", "TRAIN_PRESETS", "TrainResult", "Batches", "train", "init_distributed",
           "save_checkpoint", "load_checkpoint", "latest_checkpoint", "main"]

CHECKPOINT_FORMAT = 1


@dataclass(frozen=True)
class DataConfig:
    """Where the batches come from (read by the entry point, `marin_data.training`; plain values only)."""

    source: str | None = None  # a corpus: local directory, s3://bucket/prefix or hf://datasets/org/name
    mixture: Mapping[str, float] | None = None  # subset names/globs -> weights; None: by token count
    mirrors: tuple[str, ...] = ()  # fallback stores of a remote source
    manifest_sha256: str | None = None  # pins the corpus's manifest
    cache_dir: str | None = None  # remote shard cache root (default ~/.cache/marin/remote)
    cache_bytes: int = 64 << 30  # remote shard cache limit per rank
    store_options: Mapping[str, Any] = field(default_factory=dict)  # endpoint_url (S3), endpoint (HF), ...
    val_fraction: float = 0.001


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Add a preset (`TRAIN_PRESETS`) rather than a flag per knob."""

    preset: str = "tiny"  # model preset (marin_model.config.PRESETS)
    steps: int = 100  # optimizer steps
    batch_size: int = 8  # sequences per rank per micro-batch
    accumulation: int = 1  # micro-batches per optimizer step
    seq_len: int = 64  # tokens per sequence
    lr: float = 3e-3  # peak learning rate
    warmup: int = 10  # steps of linear warmup
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * this
    weight_decay: float = 0.1  # AdamW, on matrices only
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    seed: int = 0  # model init and the loader's shuffle
    autocast: str = "auto"  # "auto" (bf16 on CUDA, off on CPU) | "bf16" | "off"
    checkpoint_dir: str | None = None  # None: no checkpoints
    checkpoint_every: int = 0  # steps between checkpoints; 0: only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept
    log_every: int = 10  # steps between log lines (the first and last are always logged)
    model_overrides: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"vocab_size": 8192}
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self):
        if min(self.steps, self.batch_size, self.accumulation, self.seq_len) < 1:
            raise ValueError("steps, batch_size, accumulation and seq_len must be >= 1")
        if self.autocast not in ("auto", "bf16", "off"):
            raise ValueError(f"autocast must be auto, bf16 or off, got {self.autocast!r}")

    def model_config(self) -> ModelConfig:
        return with_overrides(get_preset(self.preset), **self.model_overrides)


TRAIN_PRESETS: dict[str, TrainConfig] = {
    # The tiny model on a CPU: ~0.1-0.5 s a step on 2 cores; the loss falls visibly within 50 steps.
    "tiny": TrainConfig(),
    # The hero run's shape: global batch 11,264 x 4096 (set batch_size x accumulation x ranks to match).
    "marin-535b-a23b": TrainConfig(preset="marin-535b-a23b", steps=1_000_000, batch_size=1, accumulation=11,
                                   seq_len=4096, lr=3e-4, warmup=2000, checkpoint_every=1000),
}


class Batches(Protocol):
    """What `train` reads: the loader's contract (`marin_data.loader.TokenLoader` is one)."""

    def __iter__(self) -> Iterable[Mapping[str, torch.Tensor]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainResult:
    steps: int  # the step reached
    records: list[dict[str, float]]  # one per optimizer step run by this call
    checkpoint: str | None  # the last checkpoint written
    model: Transformer


def init_distributed() -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)``; joins the process group ``torchrun`` describes in the environment
    (NCCL when CUDA is present, else gloo), once."""
    cuda = torch.cuda.is_available()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if not cuda:
        return rank, world, torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return rank, world, torch.device("cuda", local)


def shutdown_distributed() -> None:
    """Leaves the process group (if one is joined): barrier, destroy, then collect garbage at once.

    The collection is what matters on gloo: the destroyed group is only freed by the garbage collector, and
    if that first happens during interpreter shutdown, a run-loop thread still releasing tensors waits for the
    GIL, Python ends the thread by unwinding through C++ code that forbids it, and the process aborts
    (SIGABRT, "terminate called without an active exception") after all its work is done. Collecting here,
    while the interpreter is whole, frees the group first (seen under load in about 1 run in 15 without)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to ``lr * min_lr_ratio``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.ndim < 2]  # norm weights
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)


def _all_reduce_mean(tensors: list[torch.Tensor], world: int) -> None:
    """Average ``tensors`` over ranks in place with one all-reduce of a flat buffer."""
    if world == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def train(cfg: TrainConfig, data: Batches, *, resume: bool = True, log: Callable[[str], None] = print,
          device: torch.device | None = None, until: int | None = None) -> TrainResult:
    """Train ``cfg.model_config()`` on ``data`` up to ``cfg.steps`` optimizer steps.

    Args:
        cfg: the run (`TrainConfig`).
        data: batches of ``cfg.batch_size`` rows of ``cfg.seq_len`` tokens for this rank, with loader state.
        resume: continue from the newest checkpoint in ``cfg.checkpoint_dir`` when there is one.
        log: where log lines go (rank 0 only).
        device: default from `init_distributed`.
        until: stop after this step (a checkpoint is written there) — a time-limited job's share of the run;
            the learning-rate schedule still spans ``cfg.steps``.

    Returns:
        A `TrainResult`: the step reached, per-step metrics, the last checkpoint, the model.
    """
    rank, world, auto_device = init_distributed()
    device = device or auto_device
    log = log if rank == 0 else (lambda line: None)
    bf16 = cfg.autocast == "bf16" or (cfg.autocast == "auto" and device.type == "cuda")
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model_config()).to(device).train()
    optimizer = _optimizer(model, cfg)
    step, previous = 0, latest_checkpoint(cfg.checkpoint_dir) if resume and cfg.checkpoint_dir else None
    if previous is not None:
        step = load_checkpoint(previous, model=model, optimizer=optimizer, data=data)
        log(f"resumed from {previous} at step {step}")
    params = [p for p in model.parameters() if p.requires_grad]
    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.accumulation * world
    records: list[dict[str, float]] = []
    checkpoint: str | None = None
    saved = 0  # records already appended to metrics.jsonl
    batches = iter(data)
    stop = min(cfg.steps, until or cfg.steps)
    while step < stop:
        t0, waited = time.perf_counter(), 0.0
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        # Summed on the device and read once per step: no host sync between micro-batches.
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, cross-entropy, z-loss, dropped fraction
        counts = torch.zeros(model.cfg.n_layers, model.cfg.moe.num_experts, dtype=torch.float64, device=device)
        for _ in range(cfg.accumulation):
            tw = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                log(f"the data ended after step {step}")
                return TrainResult(step, records, checkpoint, model)
            waited += time.perf_counter() - tw
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                out = model(batch["input_ids"].to(device), batch["labels"].to(device),
                            segment_ids_BS=batch["segment_ids"].to(device), positions_BS=batch["positions"].to(device))
            (out.loss / cfg.accumulation).backward()
            dropped = torch.stack([s.dropped for s in out.router]).double().mean()
            sums += torch.stack([out.loss.detach().double(), out.ce_loss.detach().double(),
                                 out.z_loss.detach().double(), dropped])
            counts += torch.stack([s.counts_E.detach().double() for s in out.router])
        _all_reduce_mean([p.grad for p in params if p.grad is not None], world)
        stats = torch.cat([sums / cfg.accumulation, counts.reshape(-1)])
        if world > 1:
            dist.all_reduce(stats)
            stats[:4] /= world
        stats = stats.cpu()
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip) if cfg.grad_clip > 0 else torch.tensor(0.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.update_router_bias()  # from the global load of this step
        step += 1
        seconds = time.perf_counter() - t0
        load = stats[4:].view_as(counts)
        records.append({"step": step, "loss": float(stats[0]), "ce_loss": float(stats[1]), "z_loss": float(stats[2]),
                        "dropped": float(stats[3]), "lr": optimizer.param_groups[0]["lr"], "grad_norm": float(norm),
                        "imbalance": float((load.max(1).values / load.mean(1).clamp(min=1e-9)).mean()),
                        "seconds": seconds, "data_wait": waited, "tokens": tokens_per_step,
                        "tokens_per_s": tokens_per_step / seconds})
        if step == 1 or step % cfg.log_every == 0 or step == stop:
            log(_format(records[-1], cfg.steps))
        if cfg.checkpoint_dir and (step == stop or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)):
            checkpoint = save_checkpoint(cfg, step=step, model=model, optimizer=optimizer, data=data, rank=rank,
                                         records=records[saved:])
            saved = len(records)
            log(f"checkpoint {checkpoint}")
    return TrainResult(step, records, checkpoint, model)


def _format(r: dict[str, float], steps: int) -> str:
    return (f"step {r['step']:>5}/{steps}  loss {r['loss']:.4f}  lr {r['lr']:.2e}  {r['tokens_per_s']:,.0f} tok/s  "
            f"data wait {r['data_wait'] * 1e3:.1f} ms ({r['data_wait'] / r['seconds']:.1%})  "
            f"experts max/mean {r['imbalance']:.2f}  dropped {r['dropped']:.3f}  z-loss {r['z_loss']:.3f}")


# --- checkpoints -------------------------------------------------------------------------------------------
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


def main(argv: list[str] | None = None) -> None:
    """``python -m marin_model.train``: the same command as ``marin-train`` (it needs `marin_data` for the data)."""
    from marin_data.cli.train import main as cli_main  # lazily: this module runs without marin_data

    cli_main(argv)


if __name__ == "__main__":
    main()
