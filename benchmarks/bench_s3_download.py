"""Download a subset from a local S3 server: `marin-data download` (SHA-256 verified) vs aws cli vs s5cmd.

All three fetch the same objects from the same moto server on 127.0.0.1, each as a fresh process into an
empty directory; the figure is the median wall time of ``--runs`` runs. Ours includes hashing every byte
and checking it against the manifest before the atomic rename; the others check nothing beyond the
transfer. moto copies the whole object for every ranged GET, so tools that split files into ranges make
the server do far more work than one GET per file does (aws cli's default 8 MiB parts on 128 MiB objects
hung moto for minutes here), which measures moto, not the client. So every tool is set to one GET per
file (marin-data with ``--part-mb 0``; it uses ranges only for subsets of fewer large files than workers,
see `marin_data.transfer.download`): aws through a config file with a multipart threshold
above the shard size and ``--workers`` concurrent requests, s5cmd with ``--numworkers`` and a part size
above the shard size. The tools run interleaved within each run, each run starting with the next tool (on
this VM, writing a GB into memory the host has reclaimed costs 0.2-2.3 s of kernel time by itself, measured
with ``dd``, so a fixed order would favour whichever tool follows the one that just freed pages); a
tool that exceeds ``--timeout`` is reported as such. Beside wall time the table gives each client's CPU
seconds (user + system): on a small machine the client and the server share the cores, so CPU spent on
hashing is time taken from the server. A ``marin-data --dry-run`` row measures marin-data's fixed cost per
process (start-up, the store client, reading and checking the manifest and shard index).

The comparison tools are not package dependencies, and awscli pins its own botocore, so install them in a
separate environment and point ``--tools-bin`` at it::

    python3 -m venv /tmp/bench-tools && /tmp/bench-tools/bin/pip install -r benchmarks/requirements.txt
    .venv/bin/python benchmarks/bench_s3_download.py --size-mb 1024 --tools-bin /tmp/bench-tools/bin

The corpus is synthetic: random bytes (incompressible, like zstd-compressed token shards) under a real
manifest, shard index and SHA256SUMS, so every tool moves exactly the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Manifest
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.layout import TOKENIZER
from marin_data.raw.tokenizer import TokenizerInfo
from marin_data.testing.local_s3 import LOCAL_S3_ENV, create_bucket, local_s3_server
from marin_data.transfer.publish_s3 import publish

ROOT = Path(__file__).resolve().parent.parent
SUBSET = "bench/random"
BUCKET = "marin-bench"
# marin-data's fixed cost per process: start-up, the store client, reading and checking the manifest and index
DRY_RUN = "marin-data --dry-run"


def make_corpus(root: Path, total_mb: int, shard_mb: int) -> int:
    """A corpus whose one subset holds ``total_mb`` MiB of random shards; returns the subset's bytes."""
    tok = b'{"model": {"type": "bench"}}'
    root.mkdir(parents=True)
    (root / TOKENIZER).write_bytes(tok)
    records, left, n = [], total_mb << 20, 0
    while left > 0:
        size = min(left, shard_mb << 20)
        rel = f"data/{SUBSET}/part-{n:05d}.parquet"
        data = os.urandom(size)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        records.append(ShardRecord(rel, SUBSET, size, hashlib.sha256(data).hexdigest(), 1, size // 4, 1))
        left, n = left - size, n + 1
    tokenizer = TokenizerInfo("bench", hashlib.sha256(tok).hexdigest(), vocab_size=256, eos_id=0)
    commit_corpus(root, Manifest("bench", "0", tokenizer, {SUBSET: SubsetInfo(0, 0, 0, 0)}), records)
    return sum(r.bytes for r in records)


def commands(tool: str, endpoint: str, dest: Path, workers: int, tools_bin: Path | None) -> list[str] | None:
    url = f"s3://{BUCKET}/corpus"
    data = f"{url}/data/{SUBSET}"

    def find(name: str) -> str | None:
        return shutil.which(name, path=str(tools_bin)) if tools_bin else shutil.which(name)

    if tool in ("marin-data", DRY_RUN):
        return [sys.executable, "-m", "marin_data", "download", url, "--subset", SUBSET, "--to", str(dest),
                "--workers", str(workers), "--part-mb", "0", "--endpoint-url", endpoint,
                *(["--dry-run"] if tool == DRY_RUN else [])]
    if tool == "aws s3 cp" and (aws := find("aws")):  # one GET per file: AWS_CONFIG_FILE from aws_config()
        return [aws, "s3", "cp", "--recursive", "--only-show-errors", data, str(dest), "--endpoint-url", endpoint]
    if tool == "s5cmd cp" and (s5 := find("s5cmd")):
        return [s5, "--endpoint-url", endpoint, "--numworkers", str(max(workers, 1)), "cp", "--part-size", "5000",
                f"{data}/*", f"{dest}/"]
    return None


def aws_config(path: Path, workers: int) -> Path:
    """An aws cli config that downloads each object with one GET (no ranged parts), ``workers`` at a time."""
    path.write_text(f"[default]\ns3 =\n  multipart_threshold = 5GB\n  max_concurrent_requests = {workers}\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024, help="subset size in MiB (the goal needs at least 1 GB)")
    ap.add_argument("--shard-mb", type=int, default=128, help="shard size in MiB")
    ap.add_argument("--runs", type=int, default=3, help="runs per tool; the median is reported")
    ap.add_argument("--workers", type=int, default=8, help="parallel files for marin-data and s5cmd")
    ap.add_argument("--tools-bin", type=Path, help="folder holding the aws and s5cmd executables")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one tool's run may take")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    env = {**os.environ, **LOCAL_S3_ENV}
    env.pop("AWS_PROFILE", None)
    os.environ.update(LOCAL_S3_ENV)
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp, local_s3_server() as endpoint:
        tmp = Path(tmp)
        nbytes = make_corpus(tmp / "corpus", args.size_mb, args.shard_mb)
        create_bucket(endpoint, BUCKET)
        publish(tmp / "corpus", to=f"s3://{BUCKET}/corpus", endpoint_url=endpoint, progress=False)
        env["AWS_CONFIG_FILE"] = str(aws_config(tmp / "aws-config", args.workers))
        tools = ("marin-data", "s5cmd cp", "aws s3 cp", DRY_RUN)
        results: dict[str, list[float]] = {t: [] for t in tools}
        cpu: dict[str, list[float]] = {t: [] for t in tools}
        for run in range(args.runs):
            for tool in tools[run % len(tools):] + tools[:run % len(tools)]:  # each tool goes first in turn
                dest = tmp / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                cmd = commands(tool, endpoint, dest, args.workers, args.tools_bin)
                if cmd is None:
                    continue
                t0, cpu0 = time.perf_counter(), _children_cpu()
                try:
                    subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                   timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    results[tool].append(float("inf"))
                    continue
                results[tool].append(time.perf_counter() - t0)
                cpu[tool].append(_children_cpu() - cpu0)
                got = sum(p.stat().st_size for p in dest.rglob("part-*.parquet"))
                if got != (0 if tool == DRY_RUN else nbytes):
                    raise SystemExit(f"{tool} fetched {got} bytes of shards, expected {nbytes}")

    print(f"\n{nbytes / 1e9:.2f} GB in {len(range(0, nbytes, args.shard_mb << 20))} shards of {args.shard_mb} MiB, "
          f"{args.runs} runs, {args.workers} workers, moto_server on 127.0.0.1\n")
    ours = statistics.median(results["marin-data"])
    print("| tool | median wall s | MB/s | time vs marin-data | runs (s) | client CPU s | verifies SHA-256 |")
    print("| --- | ---: | ---: | ---: | --- | ---: | --- |")
    for tool, times in results.items():
        if not times:
            print(f"| {tool} | not installed | | | | | |")
            continue
        med = statistics.median(times)
        rate = "" if tool == DRY_RUN else f"{nbytes / med / 1e6:.0f}"
        print(f"| {tool} | {med:.2f} | {rate} | {med / ours:.2f}x | {', '.join(f'{t:.2f}' for t in times)} | "
              f"{statistics.median(cpu[tool]):.2f} | {'yes' if tool == 'marin-data' else '' if tool == DRY_RUN else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps({"bytes": nbytes, "shard_mb": args.shard_mb, "workers": args.workers,
                                         "seconds": results, "cpu_seconds": cpu}, indent=2))


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
