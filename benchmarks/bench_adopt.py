"""`marin-data adopt`'s hashing against `verify`'s on the same Levanter store.

A store of Levanter caches (random token ids below a Llama-3 vocabulary, int32, lz4, Levanter's chunk grid
shrunk so that the store has many chunk files) is written with `marin_data.levanter.write_cache`. Each
repeat pins it with `adopt` (its hashing phase, `AdoptReport.seconds`, and its whole wall time, checks and
manifest included) and re-hashes it with `verify_corpus` (its hashing phase, `VerifyReport.seconds`), in an
order rotated per repeat, on a warm page cache; the figures are medians with the spread.

    .venv/bin/python benchmarks/bench_adopt.py                   # ~256 MB, 5 repeats
    .venv/bin/python benchmarks/bench_adopt.py --size-mb 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from marin_data.corpus.verify import verify_corpus
from marin_data.layout import CARD, CROISSANT, MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER
from marin_data.levanter import write_cache
from marin_data.levanter.adopt import adopt


def build(root: Path, size_mb: int, cells: int = 4) -> int:
    rng = np.random.default_rng(0)
    tokens = size_mb * (1 << 20) // 4 // cells
    for c in range(cells):
        lengths = rng.integers(200, 4000, tokens // 1000)
        docs = [rng.integers(0, 128_256, int(n)).astype(np.int32) for n in lengths]
        write_cache(root / f"cluster={c}/quality=4", docs, chunk=1 << 22, inner=1 << 18)
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def unpin(root: Path) -> None:
    for name in (MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER, CARD, CROISSANT):
        (root / name).unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-adopt-") as tmp:
        root = Path(tmp) / "store"
        nbytes = build(root, args.size_mb)
        tok = Path(tmp) / "tok"
        t = Tokenizer(models.BPE(unk_token="<unk>"))
        t.pre_tokenizer = pre_tokenizers.ByteLevel()
        t.train_from_iterator(["hello world"] * 10,
                              trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"]))
        tok.mkdir()
        t.save(str(tok / "tokenizer.json"))
        adopt(root, tokenizer=str(tok))  # warm the page cache
        rows = {"adopt hashing": [], "adopt wall": [], "verify hashing": []}
        for r in range(args.repeats):
            order = ["adopt", "verify"] if r % 2 == 0 else ["verify", "adopt"]
            for what in order:
                if what == "adopt":
                    unpin(root)
                    t0 = time.perf_counter()
                    report = adopt(root, tokenizer=str(tok))
                    rows["adopt wall"].append(time.perf_counter() - t0)
                    rows["adopt hashing"].append(report.seconds)
                else:
                    rows["verify hashing"].append(verify_corpus(root, progress=False).seconds)
        med = {k: statistics.median(v) for k, v in rows.items()}
        ratios = [v / a for v, a in zip(rows["verify hashing"], rows["adopt hashing"])]
        out = {"bytes": nbytes, "cores": os.cpu_count(), "machine": platform.processor() or platform.machine(),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip(),
               "median_seconds": med, "adopt_hashing_over_verify_hashing_throughput": {
                   "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
               "adopt_wall_over_verify_hashing_throughput": med["verify hashing"] / med["adopt wall"],
               "runs": rows}
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
