"""Time the trainer waits for data: ``marin-train`` on ``tiny`` streaming from S3 and from a Hub mirror.

The sample corpus (``marin-data sample``; built if ``--corpus`` does not exist) is published to a moto S3
server and served by ``marin-data serve``, each in its own process on 127.0.0.1. For each source, the tiny
model trains ``--steps`` steps twice through `marin_train.data.run_training` (the ``marin-train`` path):
*cold* with an empty shard cache (every shard is fetched, verified and decoded on the way), then *warm*
with the cache the cold run filled (a fresh run from step 0; nothing is fetched). The figure is the sum
of the time spent in the loader's ``next()`` over the sum of step times; the first step (which also
builds the stream and JIT-loads the index kernels) is shown apart. Goal: under 1% warm.

    .venv/bin/python benchmarks/bench_train_data_wait.py --steps 200              # the record
    .venv/bin/python benchmarks/bench_train_data_wait.py --steps 20 --quick       # quick check (S3 only)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIXTURE = {"code/*": 0.5, "prose/*": 0.4, "reference/*": 0.1}


def run(source: str, cache_dir: Path, steps: int, store_options: dict) -> dict:
    from marin_train.data import run_training
    from marin_train.config import TRAIN_PRESETS, DataConfig

    cfg = dataclasses.replace(TRAIN_PRESETS["tiny"], steps=steps, log_every=10**9, data=DataConfig(
        source=source, mixture=MIXTURE, cache_dir=str(cache_dir), cache_bytes=64 << 20, store_options=store_options))
    lines: list[str] = []
    t0 = time.perf_counter()
    records = run_training(cfg, resume=False, log=lines.append).records
    wall = time.perf_counter() - t0
    rest = records[1:]
    return {"first_wait": records[0]["data_wait"], "first_step": records[0]["seconds"],
            "wait": sum(r["data_wait"] for r in rest), "step": sum(r["seconds"] for r in rest),
            "tok_s": sum(r["tokens"] for r in rest) / sum(r["seconds"] for r in rest), "wall": wall,
            "cache": next((line for line in lines if line.startswith("shard cache")), "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT / "out" / "quickstart" / "sample")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="S3 only")
    args = parser.parse_args()

    from marin_data.corpus.sample import build_sample
    from marin_data.testing.local_s3 import LOCAL_S3_ENV, create_bucket, local_s3_server
    from marin_data.testing.mirror import mirror_process
    from marin_data.transfer.publish_s3 import publish

    if not (args.corpus / "manifest.json").exists():
        build_sample(args.corpus)
    os.environ.update(LOCAL_S3_ENV)
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    rows = []
    try:
        copy = work / "hub" / "marin" / "sample"
        shutil.copytree(args.corpus, copy)
        with local_s3_server() as endpoint:
            create_bucket(endpoint, "bench-train")
            publish(copy, to="s3://bench-train/sample", endpoint_url=endpoint, progress=False)
            for temp in ("cold", "warm"):
                rows.append(("S3 (moto)", temp, run("s3://bench-train/sample", work / "cache-s3", args.steps,
                                                    {"endpoint_url": endpoint})))
        if not args.quick:
            with mirror_process(work / "hub") as url:
                for temp in ("cold", "warm"):
                    rows.append(("marin-data serve (hf://)", temp, run("hf://datasets/marin/sample", work / "cache-hf",
                                                                       args.steps, {"endpoint": url})))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\ntiny, {args.steps} steps of 8 x 64 tokens, mixture {MIXTURE}, 64 MiB shard cache, torch threads "
          f"{__import__('torch').get_num_threads()}, {os.cpu_count()} CPUs")
    print(f"| source | cache | data wait, steps 2-{args.steps} | first step: wait / step | tokens/s | run wall |")
    print("|---|---|---:|---:|---:|---:|")
    for source, temp, r in rows:
        print(f"| {source} | {temp} | {r['wait'] / r['step']:.2%} ({r['wait'] * 1e3:.0f} ms of {r['step']:.1f} s) | "
              f"{r['first_wait']:.2f} s / {r['first_step']:.2f} s | {r['tok_s']:,.0f} | {r['wall']:.1f} s |")
    for source, temp, r in rows:
        print(f"{source}, {temp}: {r['cache']}")


if __name__ == "__main__":
    sys.exit(main())
