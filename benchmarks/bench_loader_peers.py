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
to a loop that only takes batches; ratios are taken within this one run. Each measurement first takes
``--warmup`` batches untimed (default 100): the steady state, once each loader has opened the shards it
starts on; ``--warmup 3`` shows a fresh process's first batches. marin serves its default batch
(``input_ids`` and ``labels``, contiguous int64, with each row's subset and position); ``--marin-segments``
also times it with ``segments=True`` (document ids and positions as well).

    benchmarks/bench_loader_peers.sh --corpus /tmp/bench-loader-corpus --steps 200 1000 2000 --repeats 3 --workers 0
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


def rate(batches, steps: int, warmup: int) -> float:
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * BATCH * SEQ_LEN / (time.perf_counter() - t0)


def floor(work: Path, steps: int, warmup: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    maps = [windows(np.load(work / f"floor-{s}.npy", mmap_mode="r")) for s in WEIGHTS]
    picks = rng.choice(len(maps), p=list(WEIGHTS.values()), size=(steps + warmup) * BATCH)
    rows = [rng.integers(0, len(maps[s])) for s in picks]
    out = np.empty((BATCH, SEQ_LEN + 1), np.int64)

    def batches():
        for step in range(steps + warmup):
            for r in range(BATCH):
                k = step * BATCH + r
                out[r] = maps[picks[k]][rows[k]]
            yield out

    return rate(batches(), steps, warmup)


def mosaic(work: Path, steps: int, warmup: int, workers: int, seed: int) -> float:
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    streams = [Stream(local=str(work / "mds" / s), proportion=w) for s, w in WEIGHTS.items()]
    dataset = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=seed, batch_size=BATCH)
    return rate(DataLoader(dataset, batch_size=BATCH, num_workers=workers), steps, warmup)


def litdata(work: Path, steps: int, warmup: int, workers: int, seed: int) -> float:
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    parts = [StreamingDataset(input_dir=str(work / "litdata" / s), item_loader=TokensLoader(block_size=SEQ_LEN + 1),
                              shuffle=True, seed=seed, drop_last=True) for s in WEIGHTS]
    combined = CombinedStreamingDataset(parts, weights=list(WEIGHTS.values()), seed=seed, iterate_over_all=False)
    return rate(StreamingDataLoader(combined, batch_size=BATCH, num_workers=workers), steps, warmup)


PEERS = {"floor": lambda work, steps, warmup, workers, seed: floor(work, steps, warmup, seed), "mosaic": mosaic,
         "litdata": litdata}


def measure(kind: str, workers: int, steps: int, warmup: int, args, work: Path, seed: int) -> float:
    """tokens/s of one measurement, in a fresh process (see the module docstring)."""
    if kind.startswith("marin"):
        cmd = [args.marin_python, str(Path(__file__).with_name("bench_loader.py")), "--rate-of", str(args.corpus),
               "--cache", str(work / "marin-cache")] + (["--segments"] if kind == "marin-segments" else [])
    else:
        cmd = [sys.executable, __file__, "--one", kind, str(workers), str(work), "--corpus", str(args.corpus)]
    cmd += ["--steps", str(steps), "--warmup", str(warmup), "--seed", str(seed)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus from bench_loader.py --keep")
    ap.add_argument("--steps", type=int, nargs="+", default=[2000], help="batches timed per measurement (each)")
    ap.add_argument("--warmup", type=int, nargs="+", default=[100],
                    help="batches taken first in every measurement, untimed (each): a loader opens the shards it "
                         "starts on (marin maps them); 3 times a fresh process's first batches")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--marin-python", help="the Python of marin's venv: also time marin's loader")
    ap.add_argument("--marin-segments", action="store_true", help="also time marin's loader with segments=True")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--one", nargs=3, metavar=("KIND", "WORKERS", "WORK"), help=argparse.SUPPRESS)
    ap.add_argument("--convert-to", type=Path, help=argparse.SUPPRESS)  # bench_loader_cold.py's: convert, then stop
    args = ap.parse_args()
    if args.convert_to:
        print(json.dumps(convert(args.corpus, args.convert_to)))
        return
    if args.one:  # a child: one measurement
        kind, workers, work = args.one
        rate_ = PEERS[kind](Path(work), args.steps[0], args.warmup[0], int(workers), args.seed)
        print(json.dumps({"tokens_per_s": rate_}))
        return
    work = Path(tempfile.mkdtemp(prefix="bench-loader-peers-"))
    kinds = [("floor", 0)] + [(peer, w) for w in args.workers for peer in ("mosaic", "litdata")]
    kinds += [("marin", 0)] if args.marin_python else []
    kinds += [("marin-segments", 0)] if args.marin_python and args.marin_segments else []
    runs = [(steps, warmup, kind, workers) for steps in args.steps for warmup in args.warmup for kind, workers in kinds]
    try:
        t0 = time.perf_counter()
        counts = convert(args.corpus, work)
        convert_s = time.perf_counter() - t0
        rows: dict[tuple, list[float]] = {run: [] for run in runs}
        for rep in range(args.repeats):
            for run in runs[rep % len(runs):] + runs[:rep % len(runs)]:
                rows[run].append(measure(run[2], run[3], run[0], run[1], args, work, rep))
                print(f"repeat {rep}: {run[0]} steps after {run[1]}, {run[2]}, {run[3]} workers: "
                      f"{rows[run][-1] / 1e6:.0f}M tokens/s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work)
    print(f"\n{platform.machine()}, windows per subset {counts}, converted in {convert_s:.1f} s, batch {BATCH} x "
          f"{SEQ_LEN}, median of {args.repeats}, each measurement in a fresh process, the order rotated each repeat")
    for steps in args.steps:
        for warmup in args.warmup:
            med = {(k, w): statistics.median(rows[steps, warmup, k, w]) for k, w in kinds}
            lit = rows.get((steps, warmup, "litdata", 0))
            print(f"\n{steps} steps timed after {warmup} untimed\n")
            print("| what | M tokens/s | vs floor | vs LitData, 0 workers | runs (M tokens/s) |")
            print("|---|---:|---:|---:|---|")
            for kind, workers in kinds:
                label = {"floor": "floor", "marin": "marin, in-process",
                         "marin-segments": "marin, in-process, segments=True"}.get(kind, f"{kind}, {workers} workers")
                mine = rows[steps, warmup, kind, workers]
                vs_lit = f"{med[kind, workers] / med['litdata', 0]:.2f}x" if lit else ""
                print(f"| {label} | {med[kind, workers] / 1e6:.0f} | {med[kind, workers] / med['floor', 0]:.2f} | "
                      f"{vs_lit} | {', '.join(f'{x / 1e6:.0f}' for x in mine)} |")
            if lit and args.marin_python:
                within = [m / x for m, x in zip(rows[steps, warmup, "marin", 0], lit)]
                print(f"\nmarin / LitData within each repeat: {', '.join(f'{r:.2f}' for r in within)}")


if __name__ == "__main__":
    main()
