"""The loader's peers on the same tokens: MosaicML streaming and LitData, next to the memory-map floor.

Runs in its own environment (they pin other torch builds): use ``benchmarks/bench_loader_peers.sh``, which
creates it and passes the arguments on. Needs only numpy, pyarrow, torch and the peers — not marin.

Input: a corpus written by ``benchmarks/bench_loader.py --keep DIR`` (subsets web/code/math). Each subset's
shards are read with pyarrow in path order, concatenated, and cut into the windows marin serves
(``seq_len + 1`` tokens, stride ``seq_len``), then written once, outside the timing, as

- MosaicML streaming MDS shards (one ``ndarray:uint32`` column), read by ``StreamingDataset`` with one
  ``Stream`` per subset at proportions 0.5/0.3/0.2, ``shuffle=True`` (its default py1e algorithm);
- LitData chunks of tokens, read by ``StreamingDataset(item_loader=TokensLoader(block_size=seq_len+1),
  shuffle=True)`` per subset, combined by ``CombinedStreamingDataset`` with weights 0.5/0.3/0.2, through
  ``StreamingDataLoader`` (how LitGPT pretrains);
- one flat ``.npy`` per subset for the floor: numpy copies of random windows into a preallocated batch
  (the same floor as ``bench_loader.py``, so the two scripts' ratios compare).

and, with ``--marin-python`` (the shell script passes ``.venv/bin/python``), marin's loader in-process on the
same corpus (``bench_loader.py --rate-of``, the shards decoded into its cache outside the timing).

Every measurement runs in a fresh process, in an order rotated each repeat: the peers leave threads behind
(MosaicML's iterator keeps its two prefetch threads running when a loop stops early), which slowed whatever
ran next in the same process; an earlier version of this script timed LitData after MosaicML in one
process and under-reported it ~2-8x. Batch 8 x 4096; figures are medians over repeats of tokens/s delivered
to a loop that only takes batches; ratios are taken within this one run.

    benchmarks/bench_loader_peers.sh --corpus /tmp/bench-loader-corpus --steps 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
SEQ_LEN, BATCH = 4096, 8


def subset_tokens(corpus: Path, subset: str) -> np.ndarray:
    import pyarrow.parquet as pq

    parts = []
    for path in sorted((corpus / "data" / subset).glob("part-*.parquet")):
        column = pq.read_table(path, columns=["tokens"]).column("tokens").combine_chunks()
        offsets = np.asarray(column.offsets)
        parts.append(np.asarray(column.values)[offsets[0] : offsets[-1]])
    return np.concatenate(parts)


def windows(tokens: np.ndarray) -> np.ndarray:
    """``[n, seq_len + 1]`` overlapping windows (a strided view, no copy)."""
    n = (len(tokens) - 1) // SEQ_LEN
    return np.lib.stride_tricks.as_strided(tokens, shape=(n, SEQ_LEN + 1), strides=(4 * SEQ_LEN, 4))


def convert(corpus: Path, work: Path) -> dict[str, int]:
    import torch
    from litdata.streaming.item_loader import TokensLoader
    from litdata.streaming.writer import BinaryWriter
    from streaming import MDSWriter

    counts = {}
    for subset in WEIGHTS:
        tokens = subset_tokens(corpus, subset)
        np.save(work / f"floor-{subset}.npy", tokens)
        win = windows(tokens)
        counts[subset] = len(win)
        with MDSWriter(out=str(work / "mds" / subset), columns={"tokens": "ndarray:uint32"}, size_limit=1 << 26,
                       progress_bar=False) as out:
            for row in win:
                out.write({"tokens": np.ascontiguousarray(row)})
        writer = BinaryWriter(str(work / "litdata" / subset), chunk_bytes="64MB", item_loader=TokensLoader())
        for i, row in enumerate(win):  # LitData's token blocks do not overlap: give it each window's L+1 tokens
            writer.add_item(i, torch.from_numpy(row.astype(np.int32)))
        writer.done()
        writer.merge()
    return counts


def rate(batches, steps: int, warmup: int = 3) -> float:
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * BATCH * SEQ_LEN / (time.perf_counter() - t0)


def floor(work: Path, steps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    maps = [windows(np.load(work / f"floor-{s}.npy", mmap_mode="r")) for s in WEIGHTS]
    picks = rng.choice(len(maps), p=list(WEIGHTS.values()), size=(steps + 3) * BATCH)
    rows = [rng.integers(0, len(maps[s])) for s in picks]
    out = np.empty((BATCH, SEQ_LEN + 1), np.int64)

    def batches():
        for step in range(steps + 3):
            for r in range(BATCH):
                k = step * BATCH + r
                out[r] = maps[picks[k]][rows[k]]
            yield out

    return rate(batches(), steps)


def mosaic(work: Path, steps: int, workers: int, seed: int) -> float:
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    streams = [Stream(local=str(work / "mds" / s), proportion=w) for s, w in WEIGHTS.items()]
    dataset = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=seed, batch_size=BATCH)
    return rate(DataLoader(dataset, batch_size=BATCH, num_workers=workers), steps)


def litdata(work: Path, steps: int, workers: int, seed: int) -> float:
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    parts = [StreamingDataset(input_dir=str(work / "litdata" / s), item_loader=TokensLoader(block_size=SEQ_LEN + 1),
                              shuffle=True, seed=seed, drop_last=True) for s in WEIGHTS]
    combined = CombinedStreamingDataset(parts, weights=list(WEIGHTS.values()), seed=seed, iterate_over_all=False)
    return rate(StreamingDataLoader(combined, batch_size=BATCH, num_workers=workers), steps)


PEERS = {"floor": lambda work, steps, workers, seed: floor(work, steps, seed), "mosaic": mosaic, "litdata": litdata}


def measure(kind: str, workers: int, args, work: Path, seed: int) -> float:
    """tokens/s of one measurement, in a fresh process (see the module docstring)."""
    if kind == "marin":
        cmd = [args.marin_python, str(Path(__file__).with_name("bench_loader.py")), "--rate-of", str(args.corpus),
               "--cache", str(work / "marin-cache"), "--steps", str(args.steps), "--seed", str(seed)]
    else:
        cmd = [sys.executable, __file__, "--one", kind, str(workers), str(work), "--steps", str(args.steps),
               "--seed", str(seed), "--corpus", str(args.corpus)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus from bench_loader.py --keep")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--marin-python", help="the Python of marin's venv: also time marin's loader")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--one", nargs=3, metavar=("KIND", "WORKERS", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a child: one measurement
        kind, workers, work = args.one
        print(json.dumps({"tokens_per_s": PEERS[kind](Path(work), args.steps, int(workers), args.seed)}))
        return
    work = Path(tempfile.mkdtemp(prefix="bench-loader-peers-"))
    runs = [("floor", 0)] + [(peer, w) for w in args.workers for peer in ("mosaic", "litdata")]
    runs += [("marin", 0)] if args.marin_python else []
    try:
        t0 = time.perf_counter()
        counts = convert(args.corpus, work)
        convert_s = time.perf_counter() - t0
        rows: dict[tuple[str, int], list[float]] = {run: [] for run in runs}
        for rep in range(args.repeats):
            for kind, workers in runs[rep % len(runs):] + runs[:rep % len(runs)]:
                rows[kind, workers].append(measure(kind, workers, args, work, rep))
                print(f"repeat {rep}: {kind}, {workers} workers: {rows[kind, workers][-1] / 1e6:.0f}M tokens/s",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work)
    med = {run: statistics.median(v) for run, v in rows.items()}
    print(f"\n{platform.machine()}, windows per subset {counts}, converted in {convert_s:.1f} s, batch {BATCH} x "
          f"{SEQ_LEN}, {args.steps} steps, median of {args.repeats}, each in a fresh process\n")
    print("| what | M tokens/s | vs floor | vs LitData, 0 workers | runs (M tokens/s) |\n|---|---:|---:|---:|---|")
    for (kind, workers), v in med.items():
        label = "floor" if kind == "floor" else "marin, in-process" if kind == "marin" else f"{kind}, {workers} workers"
        runs_m = ", ".join(f"{x / 1e6:.0f}" for x in rows[kind, workers])
        vs_lit = f"{v / med['litdata', 0]:.2f}x" if ('litdata', 0) in med else ""
        print(f"| {label} | {v / 1e6:.0f} | {v / med['floor', 0]:.2f} | {vs_lit} | {runs_m} |")


if __name__ == "__main__":
    main()
