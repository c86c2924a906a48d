"""What the per-layer MoE health costs a training step: the step's statistics the loop collects, before and
after the per-layer fields (z-loss, dropped fraction, expert load, bias spread per layer; `moe_health`).

"before" is the collection the loop did without them (the loss, cross-entropy, z-loss and dropped fraction
averaged over layers, the per-expert counts, one device-to-host copy, the mean max/mean load); "after" is the
loop's (per-layer z-loss and dropped, counts, the bias spread of every layer, one copy, then `moe_health`).
Both run on the router statistics of one real forward of the model (``--preset``), alternating, ``--iters``
times each per repeat; the figure is the median per-step time over repeats, next to the median time of a
whole training step of the same model and batch (`marin_train.loop.train`, steps 2-N).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_train_metrics.py --preset tiny
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_train_metrics.py --preset marin-mid --steps 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


def before(out, layers: int) -> dict:
    dropped = torch.stack([s.dropped for s in out.router]).double().mean()
    sums = torch.stack([out.loss.detach().double(), out.ce_loss.detach().double(), out.z_loss.detach().double(),
                        dropped])
    counts = torch.stack([s.counts_E.detach().double() for s in out.router])
    stats = torch.cat([sums, counts.reshape(-1)]).cpu()
    load = stats[4:].view_as(counts)
    return {"imbalance": float((load.max(1).values / load.mean(1).clamp(min=1e-9)).mean())}


def after(out, layers: int, experts: int, blocks) -> dict:
    from marin_train.metrics import moe_health

    sums = torch.cat([torch.stack([out.loss.detach(), out.ce_loss.detach()]).double(),
                      torch.stack([s.z_loss.detach() for s in out.router]).double(),
                      torch.stack([s.dropped.detach() for s in out.router]).double(),
                      torch.cat([s.counts_E.detach() for s in out.router]).double()])
    bias_L = torch.stack([b.moe.bias_E.max() - b.moe.bias_E.min() for b in blocks]).double()
    stats = torch.cat([sums, bias_L]).cpu().numpy()
    z_L, dropped_L = stats[2:2 + layers], stats[2 + layers:2 + 2 * layers]
    load_LE = stats[2 + 2 * layers:-layers].reshape(layers, experts)
    health = moe_health(load_LE, z_L, dropped_L, stats[-layers:])
    return {"imbalance": float((load_LE.max(1) / np.maximum(load_LE.mean(1), 1e-9)).mean()), **health}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT / "out" / "quickstart" / "sample")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=10, help="training steps timed for the step time")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from marin_data.corpus.manifest import load_corpus
    from marin_data.corpus.sample import build_sample
    from marin_data.loader import LoaderConfig, make_loader
    from marin_model.model import Transformer
    from marin_train.config import TRAIN_PRESETS
    from marin_train.loop import train

    if not (args.corpus / "manifest.json").exists():
        build_sample(args.corpus)
    corpus = load_corpus(args.corpus)
    with tempfile.TemporaryDirectory() as work:
        vocab = corpus.manifest.tokenizer.vocab_size
        cfg = replace(TRAIN_PRESETS["tiny"], preset=args.preset, steps=args.steps, log_every=10**9,
                      model_overrides={"vocab_size": vocab})
        config = LoaderConfig(seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed, segments=True)
        records = train(cfg, make_loader(corpus, config, cache_dir=f"{work}/c"), log=lambda _: None).records
        step = statistics.median(r["seconds"] for r in records[1:])
        torch.manual_seed(0)
        model = Transformer(cfg.model_config()).train()
        batch = next(iter(make_loader(corpus, config, cache_dir=f"{work}/c")))
        out = model(batch["input_ids"], batch["labels"], segment_ids_BS=batch["segment_ids"],
                    positions_BS=batch["positions"])
    layers, experts = cfg.model_config().n_layers, cfg.model_config().moe.num_experts
    times = {"before": [], "after": []}
    for _ in range(args.repeats):
        for name, fn in (("before", lambda: before(out, layers)),
                         ("after", lambda: after(out, layers, experts, model.blocks))):
            fn()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            times[name].append((time.perf_counter() - t0) / args.iters)
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"{args.preset}: {layers} layers x {experts} experts, torch threads {torch.get_num_threads()}")
    print(f"| collection | per step (ms) | spread (ms) | share of a {step * 1e3:.0f} ms step |")
    print("|---|---:|---:|---:|")
    for name, t in (("before", times["before"]), ("after", times["after"])):
        print(f"| {name} | {statistics.median(t) * 1e3:.3f} | {min(t) * 1e3:.3f}-{max(t) * 1e3:.3f} | "
              f"{statistics.median(t) / step:.2%} |")
    print(f"added by the per-layer fields: {(a - b) * 1e3:.3f} ms a step, {(a - b) / step:.2%} of the step")


if __name__ == "__main__":
    main()
