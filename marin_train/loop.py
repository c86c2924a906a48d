"""The training loop: one optimizer step after another on any iterable of batches in the loader's contract.

The model is sharded over all ranks (`marin_train.parallel`: FSDP2 and expert parallelism on a device
mesh), at every world size including 1, which joins a process group of one. One step: ``accumulation``
micro-batches, each forward (bf16 compute on CUDA through FSDP's mixed-precision policy; fp32 on CPU by
default, where bf16 buys little and costs exactness) and backward of ``loss / accumulation``, with the wait for
the loader's ``next()`` measured apart; FSDP reduce-scatters the gradients; clipping on the sharded gradients,
AdamW (no weight decay on norms), linear warmup then cosine (a resume keeps the checkpoint's schedule); then
the balancing bias moves from the *global* expert load of the step. A stop request (`marin_train.signals`)
rides on the step's all-reduce, so every rank stops after the same step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.distributed as dist

from marin_model.model import Transformer
from marin_train.checkpoint import (Batches, checkpoint_config, latest_checkpoint, load_checkpoint, restore_loader,
                                   save_checkpoint)
from marin_train.config import TrainConfig
from marin_train.distributed import init_distributed
from marin_train.metrics import MetricsSinks, moe_health
from marin_train.parallel import clip_grad_norm, make_mesh, parallelize, rescale_expert_grads

__all__ = ["LR_SCHEDULE", "TrainResult", "build_model", "lr_at", "lr_schedule", "segment_inputs", "train"]

# The model's document-masking inputs and the batch fields that carry them (`LoaderConfig(segments=True)`);
# a batch without them trains with causal attention across its packed documents.
_SEGMENTS = {"segment_ids_BS": "segment_ids", "positions_BS": "positions"}


def segment_inputs(batch: Mapping[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The model's document-masking arguments from a loader batch, on ``device``: none when the batch has no
    segments (``"levanter"`` packing), so that attention is causal across its documents."""
    return {k: batch[name].to(device) for k, name in _SEGMENTS.items() if name in batch}


@dataclass
class TrainResult:
    steps: int  # the step reached
    records: list[dict[str, float]]  # one per optimizer step run by this call
    checkpoint: str | None  # the last checkpoint written
    model: Transformer
    stopped: bool = False  # a signal stopped the run early (`marin_train.signals`), on every rank at the same step


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then cosine decay to ``lr * min_lr_ratio`` at ``steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


# The fields of a run's config that make its learning-rate schedule (`lr_at`); a checkpoint keeps them.
LR_SCHEDULE = ("lr", "warmup", "min_lr_ratio", "steps")


def _schedule_fields(cfg: TrainConfig) -> dict[str, float]:
    return {k: getattr(cfg, k) for k in LR_SCHEDULE}


def _describe(fields: dict[str, float]) -> str:
    return (f"peak {fields['lr']:.2e}, warmup {fields['warmup']} steps, cosine to "
            f"{fields['lr'] * fields['min_lr_ratio']:.2e} at step {fields['steps']}")


def lr_schedule(cfg: TrainConfig, saved: dict, *, reschedule: bool = False,
                log: Callable[[str], None] = print) -> TrainConfig:
    """The config `lr_at` reads on a resume: ``cfg`` with the checkpoint's schedule (its ``lr_schedule``, or
    for a checkpoint written before it kept one, its run's config), or with ``reschedule`` ``cfg``'s own.
    A run resumed with another ``--steps`` keeps the checkpoint's schedule and stops at ``cfg.steps`` on it;
    the learning rate of a step is then the one the interrupted run would have used. ``log`` says which
    schedule the run follows, and what the other would have been."""
    theirs = saved.get("lr_schedule") or {k: saved["train"][k] for k in LR_SCHEDULE}
    ours = _schedule_fields(cfg)
    if reschedule:
        log(f"learning-rate schedule rebuilt from this run's settings (--reschedule): {_describe(ours)}"
            + ("" if ours == theirs else f"; the checkpoint's was {_describe(theirs)}"))
        return cfg
    differs = ", ".join(f"{k} {ours[k]} (the checkpoint's {theirs[k]})" for k in LR_SCHEDULE if ours[k] != theirs[k])
    log(f"learning-rate schedule from the checkpoint: {_describe(theirs)}" + (
        f"; this run's {differs} leave it as it is (--reschedule rebuilds it from them)" if differs else "")
        + (f"; the run stops at step {cfg.steps}" if ours["steps"] != theirs["steps"] else ""))
    return replace(cfg, **theirs)


def _optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices only; the experts in a group of their own: they live on another mesh,
    and the foreach kernels take one mesh at a time."""
    named = list(model.named_parameters())
    experts = [p for n, p in named if ".experts." in n]
    dense = [p for n, p in named if ".experts." not in n and p.ndim >= 2]
    other = [p for n, p in named if p.ndim < 2]  # norm weights
    return torch.optim.AdamW([{"params": dense, "weight_decay": cfg.weight_decay},
                              {"params": experts, "weight_decay": cfg.weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)


def build_model(cfg: TrainConfig, device: torch.device) -> Transformer:
    """The model of ``cfg``, initialised from ``cfg.seed`` (the same on every rank) and sharded over all ranks."""
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model_config()).to(device).train()
    model.recompute = cfg.recompute
    if cfg.compile:
        for block in model.blocks:
            block.compile()
    return parallelize(model, make_mesh(cfg.ep, device.type), bf16=bf16)


def train(cfg: TrainConfig, data: Batches, *, resume: bool = True, log: Callable[[str], None] = print,
          device: torch.device | None = None, until: int | None = None,
          evaluate: Callable[[Transformer], dict[str, float]] | None = None,
          started: float | None = None, stop: Callable[[], bool] | None = None,
          reschedule: bool = False) -> TrainResult:
    """Train ``cfg.model_config()`` on ``data`` up to ``cfg.steps`` optimizer steps.

    Args:
        cfg: the run (`TrainConfig`).
        data: batches of ``cfg.batch_size`` rows of ``cfg.seq_len`` tokens for this rank, with loader state;
            with ``segment_ids`` and ``positions``, attention stays within each document.
        resume: continue from the newest checkpoint in ``cfg.checkpoint_dir`` when there is one.
        log: where log lines go (rank 0 only).
        device: default from `init_distributed`.
        until: stop after this step (a checkpoint is written there) — a time-limited job's share of the run;
            the learning-rate schedule still spans ``cfg.steps``.
        evaluate: with ``cfg.eval_every``, called on the model (all ranks) every that many steps and at the
            last step; the fields it returns join that step's metrics record (`marin_train.evaluate`).
        started: the ``time.perf_counter()`` the run started at, for ``time_to_first_step`` (default: now).
        stop: read once per step on every rank (`marin_train.signals.StopSignals.requested`); when it is True
            on any rank, all of them stop after that step, with a checkpoint when ``cfg.checkpoint_dir`` is set.
        reschedule: on resume, build the learning-rate schedule from ``cfg`` instead of keeping the
            checkpoint's (`lr_schedule`).

    Returns:
        A `TrainResult`: the step reached, per-step metrics (`marin_train.metrics.FIELDS`), the last
        checkpoint, the model.
    """
    started = time.perf_counter() if started is None else started
    rank, world, auto_device = init_distributed()
    device = device or auto_device
    log = log if rank == 0 else (lambda line: None)
    previous = latest_checkpoint(cfg.checkpoint_dir) if resume and cfg.checkpoint_dir else None
    # A mixture schedule given from a step on changes the stream's description, not its past sequences.
    strict_data = not cfg.data.mixture_from
    if previous is not None:  # the loader's position first: its shards are fetched while the model is built
        restore_loader(previous, data, strict=strict_data)
    if hasattr(data, "prepare"):
        data.prepare()
    with (MetricsSinks(tensorboard=cfg.tensorboard_dir, wandb=cfg.wandb_project, checkpoint_dir=cfg.checkpoint_dir,
                       config=asdict(cfg)) if rank == 0 else MetricsSinks()) as sinks:
        return _train(cfg, data, previous=previous, strict_data=strict_data, log=log, device=device, world=world,
                      until=until, started=started, sinks=sinks, evaluate=evaluate, stop=stop, reschedule=reschedule)


def _train(cfg: TrainConfig, data: Batches, *, previous, strict_data: bool, log: Callable[[str], None],
           device: torch.device, world: int, until: int | None, started: float, sinks: MetricsSinks,
           evaluate: Callable[[Transformer], dict[str, float]] | None, stop: Callable[[], bool] | None,
           reschedule: bool) -> TrainResult:
    """`train` from the model on: build it, load the checkpoint, run the steps."""
    model = build_model(cfg, device)
    optimizer = _optimizer(model, cfg)
    step, schedule = 0, cfg
    if previous is not None:
        step = load_checkpoint(previous, model=model, optimizer=optimizer, global_batch=cfg.global_batch(world),
                               strict_data=strict_data)
        log(f"resumed from {previous} at step {step}")
        schedule = lr_schedule(cfg, checkpoint_config(previous), reschedule=reschedule, log=log)
    params = [p for p in model.parameters() if p.requires_grad]
    tokens_per_step = cfg.global_batch(world) * cfg.seq_len
    layers, experts = model.cfg.n_layers, model.cfg.moe.num_experts
    records: list[dict[str, float]] = []
    checkpoint: str | None = None
    saved = 0  # records already appended to metrics.jsonl
    batches = iter(data)
    last = min(cfg.steps, until or cfg.steps)
    while step < last:
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(schedule, step)
        # Summed on the device and read once per step: no host sync between micro-batches. Layout: loss,
        # cross-entropy, z-loss [L], dropped fraction [L], expert load [L*E], ranks asked to stop [1].
        sums = torch.zeros(2 + 2 * layers + layers * experts + 1, dtype=torch.float64, device=device)
        waited = _accumulate(model, batches, sums[:-1], cfg.accumulation, device)
        if waited is None:
            log(f"the data ended after step {step}")
            return TrainResult(step, records, checkpoint, model)
        sums[:2 + 2 * layers] /= cfg.accumulation
        if stop is not None and stop():
            sums[-1] = 1
        dist.all_reduce(sums)
        sums[:2 + 2 * layers] /= world
        # The bias this step routed with (the same on every rank), read with the sums: one host copy a step.
        bias_L = torch.stack([b.moe.bias_E.max() - b.moe.bias_E.min() for b in model.blocks]).double()
        stats = torch.cat([sums, bias_L]).cpu().numpy()
        rescale_expert_grads(model)
        norm = clip_grad_norm(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.update_router_bias()  # from the global load of this step
        step += 1
        seconds = time.perf_counter() - t0
        stopping = bool(stats[-layers - 1])  # the same on every rank: all stop after this step
        records.append({"step": step, **_step_stats(stats, layers, experts), "lr": optimizer.param_groups[0]["lr"],
                        "grad_norm": float(norm), "seconds": seconds, "data_wait": waited, "tokens": tokens_per_step,
                        "tokens_seen": step * tokens_per_step, "tokens_per_s": tokens_per_step / seconds})
        if len(records) == 1:
            records[0]["time_to_first_step"] = time.perf_counter() - started
        if len(records) == 1 or step % cfg.log_every == 0 or step == last or stopping:
            log(_format(records[-1], cfg.steps))
        if evaluate is not None and cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            records[-1].update(evaluate(model))
            log(f"eval  {step:>5}/{cfg.steps}  loss {records[-1]['eval/loss']:.4f}  bits/byte "
                f"{records[-1]['eval/bpb']:.4f}  ({records[-1]['eval/tokens']:,} held-out tokens, "
                f"{records[-1]['eval/seconds']:.1f} s)")
        if len(records) == 1:
            log(f"time to first step: {records[0]['time_to_first_step']:.1f} s (the step itself {seconds:.1f} s, of "
                f"which {waited:.1f} s waiting for data)")
        sinks.write(records[-1])
        if cfg.checkpoint_dir and (step == last or stopping or (cfg.checkpoint_every and
                                                              step % cfg.checkpoint_every == 0)):
            checkpoint = save_checkpoint(cfg, step=step, model=model, optimizer=optimizer, data=data,
                                         records=records[saved:], log=log, lr_schedule=_schedule_fields(schedule))
            saved = len(records)
            log(f"checkpoint {checkpoint}")
        if stopping and step < last:
            log(f"stopped by a signal after step {step}: " + (
                f"checkpoint {checkpoint}; the same command resumes from it" if cfg.checkpoint_dir else
                "nothing is saved (no --checkpoint-dir)"))
            return TrainResult(step, records, checkpoint, model, stopped=True)
    return TrainResult(step, records, checkpoint, model)


def _accumulate(model: Transformer, batches, sums: torch.Tensor, accumulation: int, device) -> float | None:
    """Forward and backward ``accumulation`` micro-batches, adding their statistics into ``sums`` (`_train`'s
    layout); returns the seconds spent waiting for ``next(batches)``, or None when the data ended."""
    waited = 0.0
    for _ in range(accumulation):
        tw = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return None
        waited += time.perf_counter() - tw
        out = model(batch["input_ids"].to(device), batch["labels"].to(device), **segment_inputs(batch, device))
        (out.loss / accumulation).backward()
        sums += torch.cat([torch.stack([out.loss.detach(), out.ce_loss.detach()]).double(),
                           torch.stack([s.z_loss.detach() for s in out.router]).double(),
                           torch.stack([s.dropped.detach() for s in out.router]).double(),
                           torch.cat([s.counts_E.detach() for s in out.router]).double()])
    return waited


def _step_stats(stats: np.ndarray, layers: int, experts: int) -> dict[str, float]:
    """Loss, router and load fields of a step's record, from its all-reduced sums and bias spread (`_train`)."""
    z_L, dropped_L = stats[2:2 + layers], stats[2 + layers:2 + 2 * layers]
    load_LE = stats[2 + 2 * layers:-layers - 1].reshape(layers, experts)
    return {"loss": float(stats[0]), "ce_loss": float(stats[1]), "z_loss": float(z_L.mean()),
            "dropped": float(dropped_L.mean()),
            "imbalance": float((load_LE.max(1) / np.maximum(load_LE.mean(1), 1e-9)).mean()),
            **moe_health(load_LE, z_L, dropped_L, stats[-layers:])}


def _format(r: dict[str, float], steps: int) -> str:
    return (f"step {r['step']:>5}/{steps}  loss {r['loss']:.4f}  lr {r['lr']:.2e}  {r['tokens_per_s']:,.0f} tok/s  "
            f"data wait {r['data_wait'] * 1e3:.1f} ms ({r['data_wait'] / r['seconds']:.1%})  "
            f"experts max/mean {r['imbalance']:.2f}  dropped {r['dropped']:.3f}  z-loss {r['z_loss']:.3f}")
