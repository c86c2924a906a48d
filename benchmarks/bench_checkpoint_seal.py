"""The cost of sealing a checkpoint: hashing its files after a save, against the save itself and the floor.

One process (a gloo group of one). A state of ``--gib`` GiB of fp32 tensors (64 MiB each) is saved with DCP
into a fresh directory ("save"); then `marin_train.checkpoint`'s seal hashes the files just written, as
``save_checkpoint`` does at every save ("seal"); then `verify_checkpoint` re-hashes them as a load does
("verify"). The floor is SHA-256 of the same number of bytes already in memory (``hashlib``, one core).
Each repeat runs all of them; the floor runs first or last, alternately. Figures are medians over repeats
with the spread; seconds per GiB and the ratios seal / save and seal / floor.

    .venv/bin/python benchmarks/bench_checkpoint_seal.py --gib 2 --repeats 5     # the record
    .venv/bin/python benchmarks/bench_checkpoint_seal.py --gib 0.25 --repeats 2  # quick check
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from marin_train.checkpoint import _seal
from marin_train.seal import verify_checkpoint


def floor(state: dict[str, torch.Tensor]) -> float:
    t0 = time.perf_counter()
    for t in state.values():
        hashlib.sha256(t.numpy().data).hexdigest()
    return time.perf_counter() - t0


def one_repeat(state: dict[str, torch.Tensor], work: Path, floor_first: bool) -> dict[str, float]:
    out: dict[str, float] = {}
    if floor_first:
        out["floor"] = floor(state)
    ckpt = work / "step-00000001"
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    t0 = time.perf_counter()
    dcp.save({"model": state}, checkpoint_id=ckpt)
    out["save"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    _seal(ckpt, 1, 0, 1)
    out["seal"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    verify_checkpoint(ckpt)
    out["verify"] = time.perf_counter() - t0
    if not floor_first:
        out["floor"] = floor(state)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint size in GiB")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", help="where to write (default: a temporary folder under /tmp)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    per = 16 << 20  # fp32 elements: 64 MiB a tensor
    n = max(1, round(args.gib * (1 << 30) / (4 * per)))
    g = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.rand(per, generator=g) for i in range(n)}
    gib = n * per * 4 / (1 << 30)
    runs = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-seal-") as tmp:
        for r in range(args.repeats):
            runs.append(one_repeat(state, Path(tmp), floor_first=r % 2 == 0))
            print({k: round(v, 3) for k, v in runs[-1].items()}, flush=True)
    dist.destroy_process_group()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"\n{gib:.2f} GiB, {args.repeats} repeats (median, min-max):")
    for k in ("save", "seal", "verify", "floor"):
        values = [r[k] for r in runs]
        print(f"  {k:6} {med[k]:7.3f} s ({min(values):.3f}-{max(values):.3f})  {med[k] / gib:6.3f} s/GiB")
    ratios = sorted(r["seal"] / r["save"] for r in runs)
    print(f"  seal / save  {statistics.median(ratios):.2f} (per repeat {', '.join(f'{x:.2f}' for x in ratios)})")
    ratios = sorted(r["seal"] / r["floor"] for r in runs)
    print(f"  seal / floor {statistics.median(ratios):.2f} (per repeat {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
