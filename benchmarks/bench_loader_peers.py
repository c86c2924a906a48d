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

Batch 8 x 4096; figures are medians over repeats of tokens/s delivered to a loop that only takes batches.

    benchmarks/bench_loader_peers.sh --corpus /tmp/bench-loader-corpus --steps 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus from bench_loader.py --keep")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-loader-peers-"))
    try:
        t0 = time.perf_counter()
        counts = convert(args.corpus, work)
        convert_s = time.perf_counter() - t0
        rows: dict[str, list[float]] = {"floor": []}
        for rep in range(args.repeats):
            rows["floor"].append(floor(work, args.steps, rep))
            for w in args.workers:
                rows.setdefault(f"mosaic, {w} workers", []).append(mosaic(work, args.steps, w, rep))
                rows.setdefault(f"litdata, {w} workers", []).append(litdata(work, args.steps, w, rep))
    finally:
        shutil.rmtree(work)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n{platform.machine()}, windows per subset {counts}, converted in {convert_s:.1f} s, batch {BATCH} x "
          f"{SEQ_LEN}, {args.steps} steps, median of {args.repeats}\n")
    print("| what | M tokens/s | vs floor |\n|---|---:|---:|")
    for k, v in med.items():
        print(f"| {k} | {v / 1e6:.0f} | {v / med['floor']:.2f} |")


if __name__ == "__main__":
    main()
