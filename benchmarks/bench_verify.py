"""`marin-data verify` throughput against the hashing floor.

The floor is bare ``hashlib`` SHA-256 (``hashlib.file_digest``) over the same files, one process per
core, files handed out largest first; coreutils ``sha256sum`` (one process per core) is shown for
context. Each repeat runs floor, verify and sha256sum side by side on a warm page cache, so the ratio
compares like with like on a noisy shared machine; the figures are medians over the repeats.

The corpus is generated with the real shard writer (random token ids below a Llama-3 vocabulary) in a
temporary directory, removed afterwards unless ``--keep``.

    .venv/bin/python benchmarks/bench_verify.py                       # ~512 MB, 5 repeats
    .venv/bin/python benchmarks/bench_verify.py --size-mb 64 --repeats 3   # quick check
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import shard_path, write_shard
from marin_data.corpus.verify import verify_corpus
from marin_data.layout import TOKENIZER
from marin_data.raw.tokenizer import TokenizerInfo

VOCAB = 128_256
BYTES_PER_TOKEN = 2.2  # zstd + BYTE_STREAM_SPLIT on uniform random ids below 2^17: measured ~2.2 B/token


def make_corpus(root: Path, size_mb: int, shard_mb: int, seed: int = 0) -> None:
    """Write about ``size_mb`` MB of real shards in two subsets and commit the manifest."""
    rng = np.random.default_rng(seed)
    tok_json = json.dumps({"model": {"type": "benchmark", "vocab_size": VOCAB}}).encode()
    root.mkdir(parents=True, exist_ok=True)
    (root / TOKENIZER).write_bytes(tok_json)
    tokenizer = TokenizerInfo(name="benchmark", sha256=hashlib.sha256(tok_json).hexdigest(), vocab_size=VOCAB,
                              eos_id=0)
    tokens_per_shard = int(shard_mb * 1e6 / BYTES_PER_TOKEN)
    n_shards = max(2, round(size_mb / shard_mb))
    records = []
    for i in range(n_shards):
        subset, number = ("pretrain/a", i // 2) if i % 2 == 0 else ("pretrain/b", i // 2)
        tokens = rng.integers(1, VOCAB, size=tokens_per_shard, dtype=np.uint32)
        offsets = np.arange(0, tokens_per_shard + 1, 2048, dtype=np.int64)
        offsets[-1] = tokens_per_shard
        rel = shard_path(subset, number)
        st = write_shard(root / rel, [f"d{j}" for j in range(len(offsets) - 1)], tokens, offsets, tokenizer)
        records.append(ShardRecord(rel, subset, st.bytes, st.sha256, st.docs, st.tokens, st.row_groups))
    manifest = Manifest(name="bench", version="0", tokenizer=tokenizer,
                        subsets={s: SubsetInfo(0, 0, 0, 0) for s in ("pretrain/a", "pretrain/b")})
    commit_corpus(root, manifest, records)


def _floor_one(path: str) -> int:
    with open(path, "rb") as f:
        hashlib.file_digest(f, "sha256")
    return os.path.getsize(path)


def hashlib_floor(pool: ProcessPoolExecutor, files: list[str]) -> float:
    t0 = time.perf_counter()
    total = sum(pool.map(_floor_one, files))
    return total / (time.perf_counter() - t0)


def sha256sum_rate(files: list[str], procs: int, total: int) -> float:
    """coreutils sha256sum, the files dealt round-robin (largest first) to ``procs`` concurrent processes."""
    t0 = time.perf_counter()
    running = [subprocess.Popen(["sha256sum", *files[i::procs]], stdout=subprocess.DEVNULL)
               for i in range(procs) if files[i::procs]]
    for p in running:
        if p.wait() != 0:
            raise RuntimeError("sha256sum failed")
    return total / (time.perf_counter() - t0)


def verify_rate(root: Path, workers: int) -> tuple[float, float]:
    """End-to-end (load manifest, walk the tree, hash) and hashing-phase rates of `verify_corpus`."""
    t0 = time.perf_counter()
    report = verify_corpus(root, workers=workers, progress=False)
    wall = time.perf_counter() - t0
    if not report.ok:
        raise RuntimeError(f"benchmark corpus failed verification: {report.problems[:3]}")
    return report.bytes_checked / wall, report.bytes_per_second


def machine() -> str:
    cpu = platform.processor() or "?"
    flags = ""
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next(ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name"))
        flags = " with SHA-NI" if " sha_ni" in info else " without SHA-NI"
    except (OSError, StopIteration):
        pass
    return f"{cpu}{flags}, {len(os.sched_getaffinity(0))} cores available, Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=512, help="corpus size (MB, 1e6 bytes)")
    ap.add_argument("--shard-mb", type=int, default=32, help="shard size (MB)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="cores to use (all)")
    ap.add_argument("--dir", type=Path, default=None, help="where to build the corpus (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated corpus")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench_verify_", dir=args.dir))
    try:
        root = tmp / "corpus"
        t0 = time.perf_counter()
        make_corpus(root, args.size_mb, args.shard_mb)
        corpus = load_corpus(root)
        sizes = {s.path: s.bytes for s in corpus.shards} | {p: r.bytes for p, r in corpus.manifest.files.items()}
        files = [str(root / p) for p in sorted(sizes, key=lambda p: -sizes[p])]
        total = sum(sizes.values())
        print(f"corpus: {len(files)} files, {total / 1e6:.0f} MB, built in {time.perf_counter() - t0:.1f}s")
        print(f"machine: {machine()}; workers: {args.workers}")
        rows: dict[str, list[float]] = {"floor": [], "verify": [], "verify_hash_phase": [], "sha256sum": []}
        with ProcessPoolExecutor(args.workers) as pool:
            hashlib_floor(pool, files)  # warm the page cache and the pool
            verify_rate(root, args.workers)  # and verify's lazy imports (tqdm, pyarrow)
            for _ in range(args.repeats):
                rows["floor"].append(hashlib_floor(pool, files))
                end_to_end, hash_phase = verify_rate(root, args.workers)
                rows["verify"].append(end_to_end)
                rows["verify_hash_phase"].append(hash_phase)
                rows["sha256sum"].append(sha256sum_rate(files, args.workers, total))
        ratios = [v / f for v, f in zip(rows["verify"], rows["floor"])]
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"\n| what ({args.workers} cores) | GB/s (median of {args.repeats}) | vs floor |")
        print("|---|---:|---:|")
        print(f"| hashlib floor (process per core) | {med['floor'] / 1e9:.2f} | 1.00 |")
        print(f"| marin-data verify, end to end | {med['verify'] / 1e9:.2f} | {statistics.median(ratios):.2f} |")
        print(f"| marin-data verify, hashing phase | {med['verify_hash_phase'] / 1e9:.2f} | "
              f"{med['verify_hash_phase'] / med['floor']:.2f} |")
        print(f"| coreutils sha256sum (process per core) | {med['sha256sum'] / 1e9:.2f} | "
              f"{med['sha256sum'] / med['floor']:.2f} |")
        print(f"\nverify/floor per repeat: {', '.join(f'{r:.2f}' for r in ratios)} (goal >= 0.90)")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
