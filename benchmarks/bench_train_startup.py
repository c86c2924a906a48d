"""``marin-train`` as a user starts it: the time to its first step and its tokens/s, per code tree and threads.

The sample corpus (``marin-data sample``; built if ``--corpus`` does not exist) is published to a moto S3
server on 127.0.0.1. Each run is ``python -m marin_train`` in a fresh process, the tiny model with the
quickstart's mixture and its 20 MiB shard cache, cold (a new cache directory), ``--steps`` steps. The time
to the first step is measured from the process's start to the moment its step-1 line is printed (so it holds
the interpreter's start and the imports, and means the same for code that does not report it); the step-1
data wait and the steady tokens/s (median over steps 2-N) are read from its log and ``metrics.jsonl``.

A *variant* is a code tree and an ``OMP_NUM_THREADS`` value (``-`` leaves it unset: the code's own choice),
``--variant LABEL=TREE:OMP``. Each repeat runs every variant once, the order rotated between repeats; the
figures are medians over repeats with the spread (min-max).

    mkdir /tmp/before && git archive <commit> | tar -x -C /tmp/before   # the code to compare with
    .venv/bin/python benchmarks/bench_train_startup.py --variant before=/tmp/before:- --variant after=.:- \\
        --variant before-omp1=/tmp/before:1 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIXTURE = ("--mixture", "code/*=0.5", "--mixture", "prose/*=0.4", "--mixture", "reference/*=0.1")
STEP1 = re.compile(r"^step +1/\d+ .* data wait ([0-9.]+) ms")


def run_once(tree: Path, omp: str, url: str, endpoint: str, steps: int, work: Path) -> dict:
    run, cache = work / "run", work / "cache"
    for old in (run, cache):
        shutil.rmtree(old, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    env.pop("OMP_NUM_THREADS", None)
    if omp != "-":
        env["OMP_NUM_THREADS"] = omp
    cmd = [sys.executable, "-m", "marin_train", "--data", url, "--endpoint-url", endpoint, *MIXTURE, "--steps",
           str(steps), "--checkpoint-dir", str(run), "--cache-dir", str(cache), "--cache-gb", "0.02",
           "--log-every", "1000"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tree)
    first, wait, lines = None, None, []
    for line in proc.stdout:
        lines.append(line)
        if first is None and (m := STEP1.match(line)):
            first, wait = time.perf_counter() - t0, float(m.group(1)) / 1e3
    if proc.wait() != 0 or first is None:
        raise RuntimeError(f"{tree} (OMP_NUM_THREADS={omp}) failed:\n{''.join(lines[-30:])}")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"to_first": first, "first_wait": wait, "tok_s": statistics.median(m["tokens_per_s"] for m in metrics[1:]),
            "threads": next((line.strip() for line in lines if line.startswith("torch intra-op")), "")}


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT / "out" / "quickstart" / "sample")
    parser.add_argument("--variant", action="append", required=True, metavar="LABEL=TREE:OMP")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    variants = []
    for v in args.variant:
        label, _, rest = v.partition("=")
        tree, _, omp = rest.rpartition(":")
        variants.append((label, Path(tree), omp))

    from marin_data.corpus.sample import build_sample
    from marin_data.testing.local_s3 import LOCAL_S3_ENV, create_bucket, local_s3_server
    from marin_data.transfer.publish_s3 import publish

    if not (args.corpus / "manifest.json").exists():
        build_sample(args.corpus)
    os.environ.update(LOCAL_S3_ENV)
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    results: dict[str, list[dict]] = {label: [] for label, _, _ in variants}
    try:
        shutil.copytree(args.corpus, work / "copy")
        with local_s3_server() as endpoint:
            create_bucket(endpoint, "bench-startup")
            publish(work / "copy", to="s3://bench-startup/sample", endpoint_url=endpoint, progress=False)
            for r in range(args.repeats):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for label, tree, omp in order:
                    results[label].append(run_once(tree, omp, "s3://bench-startup/sample", endpoint, args.steps,
                                                   work))
                    print(f"repeat {r + 1} {label}: {results[label][-1]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.repeats} repeats, {args.steps} steps, tiny, cold 20 MiB cache, {os.cpu_count()} CPUs, load "
          f"average {os.getloadavg()[0]:.1f} at the end")
    print("| variant | OMP_NUM_THREADS | time to first step (s) | step-1 data wait (s) | tokens/s, steps 2-N |")
    print("|---|---|---:|---:|---:|")
    for label, _, omp in variants:
        rs = results[label]
        print(f"| {label} | {'unset' if omp == '-' else omp} | {spread([r['to_first'] for r in rs], '.1f')} | "
              f"{spread([r['first_wait'] for r in rs], '.2f')} | {spread([r['tok_s'] for r in rs], ',.0f')} |")


if __name__ == "__main__":
    sys.exit(main())
