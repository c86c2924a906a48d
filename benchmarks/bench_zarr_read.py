"""Reading a Levanter cache's tokens: our chunk-file reader vs zarr-python vs tensorstore (Levanter's own).

The cache is written once with `marin_data.levanter.write_cache` at Levanter's grid (one chunk file), in
both codec generations: int32 + blosc lz4 clevel 5 and int64 + blosc zstd clevel 1. Each repeat reads all
tokens with each reader in rotated order, from the page cache, and checks them equal; figures are medians
of the repeats in tokens/s. tensorstore is not a dependency: pass ``--tensorstore-python`` naming a Python
that has it (a throwaway venv); it then runs as its own process, timing only its own read.

    .venv/bin/python benchmarks/bench_zarr_read.py --tokens 16000000 --repeats 5 \\
        --tensorstore-python /tmp/zv/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def read_tensorstore(root: str, n: int) -> float:
    import tensorstore as ts

    t0 = time.perf_counter()
    d = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{root}/input_ids/data"}}, open=True).result()
    d[0:n].read().result()
    return time.perf_counter() - t0


def read_zarr(root: str, n: int) -> float:
    import zarr

    t0 = time.perf_counter()
    zarr.open_array(f"{root}/input_ids/data", mode="r")[0:n]
    return time.perf_counter() - t0


def read_ours(root: str, n: int) -> float:
    from marin_data.levanter import open_cache
    from marin_data.stores.local import LocalStore

    t0 = time.perf_counter()
    cache = open_cache(LocalStore(root))
    for part in cache.parts:
        for _ in cache.iter_tokens(part):
            pass
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tensorstore-python", default=None)
    ap.add_argument("--only-tensorstore", nargs=2, metavar=("ROOT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only_tensorstore:
        print(read_tensorstore(args.only_tensorstore[0], int(args.only_tensorstore[1])))
        return
    from marin_data.levanter import LZ4, ZSTD, write_cache

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 2000, args.tokens // 500)
    lengths = lengths[np.cumsum(lengths) <= args.tokens]
    tokens = (rng.zipf(1.2, int(lengths.sum())) % 128_256)
    docs = np.split(tokens, np.cumsum(lengths)[:-1])
    readers = {"ours": read_ours, "zarr-python": read_zarr}
    if args.tensorstore_python:
        readers["tensorstore"] = lambda root, n: float(subprocess.run(
            [args.tensorstore_python, __file__, "--only-tensorstore", root, str(n)], capture_output=True, text=True,
            check=True).stdout)
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-zarr-") as tmp:
        for name, dtype, codec in (("int32/lz4", "int32", LZ4), ("int64/zstd", "int64", ZSTD)):
            root = f"{tmp}/{dtype}"
            write_cache(root, docs, dtype=dtype, codec=codec)
            n = int(lengths.sum())
            times = {r: [] for r in readers}
            names = list(readers)
            for rep in range(args.repeats + 1):  # the first round warms the page cache and is dropped
                order = names[rep % len(names):] + names[:rep % len(names)]
                for r in order:
                    seconds = readers[r](root, n)
                    if rep:
                        times[r].append(seconds)
            out[name] = {r: {"Mtokens_per_s_median": round(n / statistics.median(t) / 1e6, 1),
                             "spread_Mtokens_per_s": [round(n / max(t) / 1e6, 1), round(n / min(t) / 1e6, 1)]}
                         for r, t in times.items()}
            out[name]["tokens"] = n
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
