"""Training on CPU, 2 gloo processes: FSDP2 x EP (marin_train) vs torch's DistributedDataParallel, and DCP
checkpoints vs ``torch.save``/``torch.load``.

Throughput: both train the same model on the same global batch of synthetic tokens (``--batch`` sequences of
``--seq`` tokens, half per rank). "fsdp-ep" is `marin_train.loop.train` with ``ep=2`` (dense weights sharded
over both ranks, each rank holding half the experts, tokens exchanged by all-to-all); "ddp" is a replica of
the unsharded model per rank under ``DistributedDataParallel`` with the same AdamW and clipping. Tokens/s is
the global batch over the median step time of the steps after the first; peak memory is each rank's RSS
high-water mark minus its RSS before the model was built (the larger of the two ranks).

Checkpoints (one process): the marin-mid model and its AdamW state after one step, written and read back with
DCP from the sharded model (world 1) and with ``torch.save``/``torch.load`` from an unsharded replica.

Each repeat runs every kind back to back, the order rotated between repeats; the figures are the medians over
repeats with the spread (min-max). One intra-op thread per process.

    .venv/bin/python benchmarks/bench_train_fsdp_cpu.py                      # the record
    .venv/bin/python benchmarks/bench_train_fsdp_cpu.py --repeats 1 --steps 3  # quick check
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from marin_model.model import Transformer
from marin_train.config import TrainConfig
from marin_train.distributed import shutdown_distributed
from marin_train.loop import _optimizer, build_model, train

KINDS = ("fsdp-ep", "ddp")


class Synthetic:
    """``steps`` batches of random tokens, one document per row; the loader's keys and state protocol."""

    def __init__(self, cfg: TrainConfig, vocab: int, rank: int) -> None:
        g = torch.Generator().manual_seed(rank)
        self.windows = torch.randint(1, vocab, (cfg.steps, cfg.batch_size, cfg.seq_len + 1), generator=g)
        self.positions = torch.arange(cfg.seq_len).expand(cfg.batch_size, -1)

    def __iter__(self):
        for w in self.windows:
            yield {"input_ids": w[:, :-1], "labels": w[:, 1:], "segment_ids": torch.zeros_like(w[:, 1:]),
                   "positions": self.positions}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict, *, strict: bool = True) -> None:
        pass


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _ddp_steps(cfg: TrainConfig, data: Synthetic) -> list[float]:
    torch.manual_seed(cfg.seed)
    model = DistributedDataParallel(Transformer(cfg.model_config()).train(), broadcast_buffers=False)
    optimizer = _optimizer(model.module, cfg)
    seconds = []
    for batch in data:
        t0 = time.perf_counter()
        out = model(batch["input_ids"], batch["labels"], positions_BS=batch["positions"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - t0)
    return seconds


def _rank(rank: int, world: int, init: str, kind: str, cfg: TrainConfig, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    data = Synthetic(cfg, cfg.model_config().vocab_size, rank)
    before = _rss()
    if kind == "ddp":
        seconds = _ddp_steps(cfg, data)
    else:
        seconds = [r["seconds"] for r in train(cfg, data, log=lambda _: None).records]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump({"seconds": seconds, "peak": peak}, f)
    shutdown_distributed()


def throughput(kind: str, cfg: TrainConfig, world: int) -> tuple[float, int]:
    """(tokens/s of the global batch, peak memory of the larger rank) of one 2-process run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result"
        mp.spawn(_rank, args=(world, f"{tmp}/init", kind, cfg, out), nprocs=world, join=True)
        ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(world)]
    step = statistics.median(max(r["seconds"][i] for r in ranks) for i in range(1, cfg.steps))
    return cfg.global_batch(world) * cfg.seq_len / step, max(r["peak"] for r in ranks)


def checkpoint_times(cfg: TrainConfig, root: Path, order: tuple[str, ...]) -> dict[str, float]:
    """Seconds to save and to load the model and AdamW state, with DCP (sharded model) and torch.save."""
    times = {}
    models = {"dcp": build_model(cfg, torch.device("cpu")), "torch": Transformer(cfg.model_config()).train()}
    for name in order:
        model = models[name]
        optimizer = _optimizer(model, cfg)
        tokens = torch.randint(0, cfg.model_config().vocab_size, (2, cfg.seq_len))
        model(tokens, tokens).loss.backward()
        optimizer.step()
        path = root / name
        t0 = time.perf_counter()
        if name == "dcp":
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=path)
        else:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        times[f"{name} save"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if name == "dcp":
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optimizer": optim_sd}
            dcp.load(state, checkpoint_id=path)
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        else:
            state = torch.load(path, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        times[f"{name} load"] = time.perf_counter() - t0
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,marin-mid")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="steps per run (the first is not timed)")
    parser.add_argument("--batch", type=int, default=8, help="global batch, sequences")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--checkpoints-only", action="store_true", help="skip the throughput runs")
    args = parser.parse_args()
    world = 2
    results: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for repeat in range(0 if args.checkpoints_only else args.repeats):
        for preset in args.presets.split(","):
            cfg = TrainConfig(preset=preset, steps=args.steps, batch_size=args.batch // world, seq_len=args.seq,
                              warmup=1, log_every=10**9, ep=world)
            kinds = KINDS[repeat % 2:] + KINDS[:repeat % 2]  # the order rotated
            for kind in kinds:
                results.setdefault((preset, kind), []).append(throughput(kind, cfg, world))
                print(f"repeat {repeat} {preset} {kind}: {results[preset, kind][-1][0]:,.0f} tok/s, "
                      f"peak {results[preset, kind][-1][1] / 2**20:,.0f} MiB", flush=True)
    if results:
        print("\n| preset | kind | tokens/s (median) | spread | peak MiB per rank (median) | fsdp-ep / ddp tokens/s |")
        print("|---|---|---:|---:|---:|---:|")
    for preset in args.presets.split(",") if results else ():
        ratio = statistics.median(a[0] / b[0] for a, b in zip(results[preset, "fsdp-ep"], results[preset, "ddp"]))
        for kind in KINDS:
            tps = [r[0] for r in results[preset, kind]]
            peak = statistics.median(r[1] for r in results[preset, kind]) / 2**20
            print(f"| {preset} | {kind} | {statistics.median(tps):,.0f} | {min(tps):,.0f}-{max(tps):,.0f} | "
                  f"{peak:,.0f} | {f'{ratio:.2f}' if kind == 'fsdp-ep' else ''} |")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    cfg = TrainConfig(preset="marin-mid", seq_len=args.seq)
    times: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            for name, t in checkpoint_times(cfg, Path(tmp), ("dcp", "torch")[::1 - 2 * (repeat % 2)]).items():
                times.setdefault(name, []).append(t)
    print("\n| marin-mid + AdamW, one process | median s | spread | dcp / torch (median of per-repeat ratios) |")
    print("|---|---:|---:|---:|")
    for name, ts in sorted(times.items()):
        ratio = statistics.median(a / b for a, b in zip(ts, times[name.replace("dcp", "torch")]))
        print(f"| {name} | {statistics.median(ts):.3f} | {min(ts):.3f}-{max(ts):.3f} | "
              f"{f'{ratio:.2f}' if name.startswith('dcp') else ''} |")
    shutdown_distributed()


if __name__ == "__main__":
    main()
