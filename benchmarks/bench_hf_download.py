"""Download a subset from `marin-data serve`: `marin-data download hf://...` vs `huggingface_hub.snapshot_download`.

Both fetch the same subset (``allow_patterns`` for snapshot_download) from the same mirror on 127.0.0.1,
which runs in its own process; each client runs as a fresh process into an empty directory, interleaved
within each run and each run starting with the next client (as in ``bench_s3_download.py``: freeing and
rewriting a GB of page cache costs the client that follows, so a fixed order would favour one), and the
figure is the median wall time of ``--runs`` runs. Both use ``--workers``
parallel files. marin-data's time includes reading and checking the manifest and shard index, SHA-256 of
every byte checked against the manifest, fsync and the atomic rename; snapshot_download checks each file's
size only (huggingface_hub 2.x hashes nothing on the plain-HTTP path). Goal: no slower,
verification included.

    .venv/bin/python benchmarks/bench_hf_download.py --size-mb 1024 --shard-mb 128 --runs 5   # the record
    .venv/bin/python benchmarks/bench_hf_download.py --size-mb 64 --shard-mb 16 --runs 2      # quick check

The corpus is the S3 benchmark's (`bench_s3_download.make_corpus`): random bytes, incompressible like
zstd-compressed token shards, under a real manifest, shard index and SHA256SUMS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_s3_download import SUBSET, make_corpus

from marin_data.testing.mirror import mirror_process

ROOT = Path(__file__).resolve().parent.parent
REPO = "bench/corpus"
SNAPSHOT = """
import sys
from huggingface_hub import snapshot_download
snapshot_download(sys.argv[1], repo_type="dataset", allow_patterns=[sys.argv[2]], local_dir=sys.argv[3],
                  max_workers=int(sys.argv[4]), endpoint=sys.argv[5])
"""


def commands(tool: str, url: str, dest: Path, workers: int) -> list[str]:
    if tool == "marin-data download":
        return [sys.executable, "-m", "marin_data", "download", f"hf://datasets/{REPO}", "--subset", SUBSET,
                "--to", str(dest), "--workers", str(workers), "--endpoint", url]
    return [sys.executable, "-c", SNAPSHOT, REPO, f"data/{SUBSET}/*", str(dest), str(workers), url]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="subset size in MiB (the goal needs at least 1 GB)")
    ap.add_argument("--shard-mb", type=int, default=128, help="shard size in MiB")
    ap.add_argument("--runs", type=int, default=3, help="runs per client; the median is reported")
    ap.add_argument("--workers", type=int, default=8, help="parallel files for both clients")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    tools = ("marin-data download", "huggingface_hub snapshot_download")
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    results: dict[str, list[float]] = {t: [] for t in tools}
    with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp:
        tmp = Path(tmp)
        nbytes = make_corpus(tmp / "hub" / REPO, args.size_mb, args.shard_mb)
        env["HF_HOME"] = str(tmp / "hf_home")  # no user cache or token involved
        with mirror_process(tmp / "hub") as url:
            for run in range(args.runs):
                for tool in tools[run % len(tools):] + tools[:run % len(tools)]:  # each client goes first in turn
                    dest = tmp / "dest"
                    shutil.rmtree(dest, ignore_errors=True)
                    t0 = time.perf_counter()
                    subprocess.run(commands(tool, url, dest, args.workers), check=True, env=env, cwd=ROOT,
                                   stdout=subprocess.DEVNULL, timeout=3600)
                    results[tool].append(time.perf_counter() - t0)
                    got = sum(p.stat().st_size for p in dest.rglob("part-*.parquet"))
                    if got != nbytes:
                        raise SystemExit(f"{tool} fetched {got} bytes of shards, expected {nbytes}")

    print(f"\n{nbytes / 1e9:.2f} GB in {-(-nbytes // (args.shard_mb << 20))} shards of {args.shard_mb} MiB, "
          f"{args.runs} runs, {args.workers} workers, marin-data serve on 127.0.0.1\n")
    print("| client | median wall s | MB/s | runs (s) | verifies SHA-256 |")
    print("| --- | ---: | ---: | --- | --- |")
    for tool, times in results.items():
        med = statistics.median(times)
        print(f"| {tool} | {med:.2f} | {nbytes / med / 1e6:.0f} | {', '.join(f'{t:.2f}' for t in times)} | "
              f"{'yes' if tool.startswith('marin') else 'no (size only)'} |")
    if args.json:
        args.json.write_text(json.dumps({"bytes": nbytes, "shard_mb": args.shard_mb, "workers": args.workers,
                                         "seconds": results}, indent=2))


if __name__ == "__main__":
    main()
