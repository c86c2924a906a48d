"""Sampling on the CPU: `marin_model.generate.generate` with the KV cache vs without it (the whole context each step).

Both variants decode greedily from the same prompt with the same randomly initialised model (eval mode, fp32),
so they produce the same tokens (checked every repeat); the figure is new tokens per second, prompt
processing included (the prefill with the cache, every step's full forward without it). The prompt plus the
new tokens are longer than the preset's sliding window, so the window layers' caches stay at their bound.
Each repeat times the two back to back, in alternating order; figures are medians over the repeats, with
the spread (min-max) and the per-repeat ratio. One intra-op thread by default (`--threads`): on a shared
2-core VM two OpenMP threads stall whenever a neighbour takes a core.

    .venv/bin/python benchmarks/bench_generate.py                       # the record: tiny and marin-mid
    .venv/bin/python benchmarks/bench_generate.py --repeats 1 --new 16  # quick check
"""

import argparse
import os
import platform
import statistics
import subprocess
import time

import torch

from marin_model.config import get_preset
from marin_model.generate import generate
from marin_model.model import Transformer

# preset: (prompt tokens, new tokens); prompt + new > the preset's window (tiny 32, marin-mid 256)
CASES = {"tiny": (48, 64), "marin-mid": (224, 64)}


def timed(model: Transformer, prompt: torch.Tensor, new: int, use_cache: bool) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    out = generate(model, prompt, new, temperature=0, use_cache=use_cache)
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(CASES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new", type=int, help="new tokens per run (default: the case's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  commit {commit}  {platform.processor() or platform.machine()}  "
          f"{os.cpu_count()} CPUs  torch {torch.__version__}  {args.threads} thread(s)  load {os.getloadavg()[0]:.1f}")
    print(f"{'preset':<10} {'prompt':>6} {'new':>4}  {'cache tok/s (min-max)':>24}  {'no cache tok/s (min-max)':>26}  "
          f"{'ratio median (min-max)':>24}")
    for name in args.presets:
        prompt_len, new = CASES[name]
        new = args.new or new
        torch.manual_seed(0)
        cfg = get_preset(name)
        model = Transformer(cfg).eval()
        prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len))
        timed(model, prompt, 2, True)  # warm up both paths (allocator, op registration)
        timed(model, prompt, 2, False)
        rates = {True: [], False: []}
        ratios = []
        for r in range(args.repeats):
            order = (True, False) if r % 2 == 0 else (False, True)
            outs, seconds = {}, {}
            for use_cache in order:
                seconds[use_cache], outs[use_cache] = timed(model, prompt, new, use_cache)
                rates[use_cache].append(new / seconds[use_cache])
            if not torch.equal(outs[True], outs[False]):
                raise SystemExit(f"{name}: the cached and uncached runs decoded different tokens")
            ratios.append(seconds[False] / seconds[True])

        def fmt(xs: list[float]) -> str:
            return f"{statistics.median(xs):,.1f} ({min(xs):,.1f}-{max(xs):,.1f})"

        print(f"{name:<10} {prompt_len:>6} {new:>4}  {fmt(rates[True]):>24}  {fmt(rates[False]):>26}  "
              f"{statistics.median(ratios):>8.2f}x ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)


if __name__ == "__main__":
    main()
