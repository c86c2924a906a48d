"""What pinning a Levanter store where it lives costs: client CPU per GB, Ray throughput, and requests per cell.

A store of Levanter caches (random token ids below a Llama-3 vocabulary, int32, LZ4, Levanter's inner chunk
and chunk files of ``--chunk-mb`` MiB of ids, tens of MB as Marin's are) is written with
`marin_data.levanter.write_cache` and uploaded to a moto server on 127.0.0.1, one plain PUT per file (so each
ETag is the object's MD5, as a GCS object or a single-part S3 upload has it, and adopt checks it). Then, in
one run:

a. **Client CPU per GB**: the whole `adopt_store` of the store (``--engine local``: threads in this process;
   the structural checks, hashing and commit) and `hash_file` over every file one after another (as adopt
   sends the jobs, a data chunk file's LZ4 frames decoded and ids checked as they stream; and bytes only),
   each counted as this process's user + system CPU (``getrusage``; moto is another process and is not
   counted), against the floor: coreutils ``sha256sum`` of the same files on local disk (its own process's
   CPU, ``wait4``), with ``openssl dgst -sha256`` (SHA-NI where the CPU has it) and hashlib's MD5 (what
   checking an ETag adds) for context. Rotated within each repeat.
b. **Throughput** (GB of the store per second of wall clock) of `adopt_store` with ``--engine ray`` on a
   private local Ray instance of 1, 2 and 4 CPUs (a fresh instance per run, its start-up timed apart:
   ``ray.init`` and one warm-up task per worker), with ``--engine local`` for reference; each run pins into
   a fresh folder, and every run must give the same manifest sha256.
c. **The structural checks alone** (`check_cells`, as adopt runs them) of each cell: requests (moto's request
   recorder) and bytes read (a counting wrapper around the store), per cell and per chunk file.
d. **Requests of the whole adopt** per cell and per file: LIST pages, HEADs, whole and ranged GETs.

Each figure comes with the 1-minute load average while it ran: on a 2-core machine shared with other jobs,
moto, the client and Ray's workers share the same cores, and 4 Ray workers cannot beat 2.

    .venv/bin/python benchmarks/bench_pin_costs.py --mb 1200 --repeats 3    # the record (~760 MB stored)
    .venv/bin/python benchmarks/bench_pin_costs.py --mb 20 --repeats 1      # quick check (< 1 minute)
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
from collections import Counter
from pathlib import Path

import numpy as np
from bench_verify import machine
from pin_counting import CountingStore, recorded_requests

from marin_data.levanter import LZ4, write_cache
from marin_data.levanter.adopt import cache_files
from marin_data.levanter.adopt_files import FileJob, hash_file
from marin_data.levanter.adopt_remote import adopt_store
from marin_data.levanter.arraymeta import LEVANTER_INNER
from marin_data.levanter.cache import open_cache
from marin_data.levanter.filehash import ChunkCheck
from marin_data.levanter.verify import check_cells
from marin_data.stores import open_store
from marin_data.stores.snapshot import SnapshotStore
from marin_data.testing.local_s3 import LOCAL_S3_ENV, create_bucket, local_s3_server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from levanter_env import LLAMA3_VOCAB, wide_tokenizer  # noqa: E402 - the tests' helper, on the path just above

BUCKET = "marin-pin-bench"
URL = f"s3://{BUCKET}/store"
FLOOR, OPENSSL, MD5 = "sha256sum (floor)", "openssl dgst -sha256", "hashlib MD5 of the same files (context)"
HASH_BYTES = "hash_file, every file, bytes only (SHA-256 + the ETag's MD5)"
HASH_FILE = "hash_file, every file as adopt sends it (+ LZ4 frames decoded, ids checked)"
ADOPT = "adopt --engine local, whole (checks, hashing on 16 threads, commit)"
DATA, OFFSETS, METADATA = "data chunk files (their index)", "offsets chunk files", "ledgers, zarr.json"


def build_store(root: Path, mb: float, cells: int, chunk_mb: int) -> None:
    """``cells`` caches (``cluster=C/quality=4``) holding ``mb`` MB of int32 ids in all, ~2,100 tokens a document."""
    rng = np.random.default_rng(0)
    tokens = int(mb * 1e6 / 4 / cells)
    chunk = (chunk_mb << 20) // 4 // LEVANTER_INNER * LEVANTER_INNER
    for c in range(cells):
        ids = rng.integers(0, LLAMA3_VOCAB, tokens, dtype=np.int32)
        cuts = np.cumsum(rng.integers(200, 4000, tokens // 200 + 1))
        write_cache(root / f"cluster={c}/quality=4", np.split(ids, cuts[cuts < tokens]), chunk=chunk,
                    inner=min(LEVANTER_INNER, chunk), codec=LZ4, tokenizer="bench", vocab_size=LLAMA3_VOCAB)


def upload(root: Path, endpoint: str) -> dict[str, int]:
    """Every file of ``root`` under `URL`, one PUT each with no checksum header: its ETag is its MD5."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          config=Config(request_checksum_calculation="when_required"))
    sizes = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        client.put_object(Bucket=BUCKET, Key=f"store/{rel}", Body=f.read_bytes())
        sizes[rel] = f.stat().st_size
    return sizes


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_run(cmd: list[str]) -> tuple[float, float]:
    """Wall and user + system CPU seconds of one child process (its own rusage, not moto's)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed with {proc.returncode}")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def in_process(fn) -> tuple[float, float, object]:
    """Wall and this process's CPU seconds of ``fn()``, and its result."""
    t0, c0 = time.perf_counter(), cpu_self()
    out = fn()
    return time.perf_counter() - t0, cpu_self() - c0, out


def pin(endpoint: str, tokenizer: Path, dest: Path, **engine) -> tuple[float, float, str]:
    """Wall, this process's CPU and the manifest sha256 of one adopt of the store into a fresh ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    wall, cpu, report = in_process(lambda: adopt_store(URL, tokenizer=str(tokenizer), pin_to=str(dest),
                                                       endpoint_url=endpoint, **engine))
    shutil.rmtree(dest, ignore_errors=True)
    return wall, cpu, report.manifest_sha256


def file_jobs(endpoint: str, sizes: dict[str, int], *, decode: bool) -> list[FileJob]:
    """A `FileJob` per file as adopt makes them (``decode``: a data chunk file's frames decoded and its ids
    checked as it streams), or with its bytes hashed and nothing else."""
    store = SnapshotStore(open_store(URL, endpoint_url=endpoint))
    listing, jobs = store.listing(), []
    for cell in sorted({"/".join(p.split("/")[:2]) for p in sizes}):
        for f in cache_files(cell, open_cache(store, cell), [p for p in sizes if p.startswith(cell + "/")]):
            chunk = ChunkCheck(f.meta, f.tokens, LLAMA3_VOCAB) if decode and f.meta is not None else None
            jobs.append(FileJob(URL, (("endpoint_url", endpoint),), listing[f.path], cell, f.kind, f.tokens,
                                f.docs, chunk))
    return jobs


def md5_of(files: list[str]) -> None:
    for f in files:
        with open(f, "rb") as fh:
            hashlib.file_digest(fh, "md5")


def cpu_figures(endpoint: str, tokenizer: Path, store: Path, sizes: dict[str, int], repeats: int,
                dest: Path, digests: set[str]) -> dict[str, list[dict]]:
    """(a): per repeat, in rotated order, wall and CPU of the floor, openssl, MD5, hash_file and a local adopt."""
    files = [str(store / p) for p in sizes]
    bare, decoding = file_jobs(endpoint, sizes, decode=False), file_jobs(endpoint, sizes, decode=True)

    def adopt_local() -> tuple[float, float]:
        wall, cpu, digest = pin(endpoint, tokenizer, dest, engine="local")
        digests.add(digest)
        return wall, cpu

    runs = {FLOOR: lambda: child_run(["sha256sum", *files]),
            OPENSSL: lambda: child_run(["openssl", "dgst", "-sha256", *files]),
            MD5: lambda: in_process(lambda: md5_of(files))[:2],
            HASH_BYTES: lambda: in_process(lambda: [hash_file(j) for j in bare])[:2],
            HASH_FILE: lambda: in_process(lambda: [hash_file(j) for j in decoding])[:2],
            ADOPT: adopt_local}
    for run in runs.values():  # warm: page cache, imports, the store client of hash_file
        run()
    rows: dict[str, list[dict]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = runs[name]()
            rows[name].append({"wall": wall, "cpu": cpu, "load": os.getloadavg()[0]})
    return rows


def _warm(_: int) -> int:
    """A Ray worker's first task: the imports `hash_file` needs, so a timed run does not pay them."""
    import marin_data.levanter.adopt_files  # noqa: F401
    import marin_data.stores.s3  # noqa: F401

    return 0


def ray_started(workers: int) -> float:
    """Start a private local Ray instance of ``workers`` CPUs as `RayEngine` does, warm each worker; seconds."""
    import logging

    import ray

    from marin_data.engines.ray import RayEngine

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=workers, object_store_memory=128 << 20, include_dashboard=False,
             logging_level=logging.WARNING)
    list(RayEngine(workers).map_unordered(_warm, list(range(workers))))
    return time.perf_counter() - t0


def ray_figures(endpoint: str, tokenizer: Path, repeats: int, counts: list[int], dest: Path,
                digests: set[str]) -> dict[str, list[dict]]:
    """(b): per repeat, each Ray size in rotated order (and the local engine): start-up, wall, load."""
    import ray

    rows: dict[str, list[dict]] = {f"ray {n}": [] for n in counts} | {"local": []}
    names = list(rows)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name == "local":
                wall, _, digest = pin(endpoint, tokenizer, dest, engine="local")
                rows[name].append({"wall": wall, "startup": 0.0, "load": os.getloadavg()[0]})
            else:
                n = int(name.split()[1])
                startup = ray_started(n)
                try:
                    wall, _, digest = pin(endpoint, tokenizer, dest, engine="ray", workers=n)
                finally:
                    ray.shutdown()
                rows[name].append({"wall": wall, "startup": startup, "load": os.getloadavg()[0]})
            digests.add(digest)
    return rows


def check_figures(endpoint: str, cells: list[str]) -> list[dict]:
    """(c): per cell, the structural checks alone: requests (moto's recorder), bytes read, chunk files, wall."""
    counting = CountingStore(open_store(URL, endpoint_url=endpoint))
    store = SnapshotStore(counting)
    store.listing()  # the one listing adopt takes first, counted apart
    out = []
    for cell in cells:
        counting.reset()
        with recorded_requests(endpoint) as requests:
            t0 = time.perf_counter()
            problems, files, _ = check_cells(store, {cell: cell})
            wall = time.perf_counter() - t0
        if problems:
            raise RuntimeError(f"the benchmark store fails its checks: {problems[:3]}")
        out.append({"cell": cell, "chunk_files": files,
                    "data_chunk_files": sum(_kind(p) == DATA for p in counting.reads),
                    "bytes": _by_kind(counting.bytes), "reads": _by_kind(counting.reads),
                    "requests": dict(Counter(kind for kind, _ in requests)), "wall": wall,
                    "load": os.getloadavg()[0]})
    return out


def _kind(path: str) -> str:
    return DATA if "/input_ids/data/c/" in path else OFFSETS if "/input_ids/offsets/c/" in path else METADATA


def _by_kind(counts: Counter) -> dict[str, int]:
    out = Counter()
    for path, n in counts.items():
        out[_kind(path)] += n
    return dict(out)


def adopt_requests(endpoint: str, tokenizer: Path, dest: Path, sizes: dict[str, int]) -> dict:
    """(d): every request of one whole local adopt, by kind, per cell and per file."""
    with recorded_requests(endpoint) as requests:
        pin(endpoint, tokenizer, dest, engine="local")
    per_cell: dict[str, Counter] = {}
    per_file: dict[str, Counter] = {}
    for kind, key in requests:
        rel = key.removeprefix("store/")
        cell = "/".join(rel.split("/")[:2]) if rel.startswith("cluster=") else "(store)"
        per_cell.setdefault(cell, Counter())[kind] += 1
        if rel in sizes:
            per_file.setdefault(rel, Counter())[kind] += 1
    by_file = Counter(tuple(sorted(c.items())) for c in per_file.values())
    return {"per_cell": {c: dict(k) for c, k in sorted(per_cell.items())},
            "files_per_cell": Counter("/".join(p.split("/")[:2]) for p in sizes if p.startswith("cluster=")),
            "per_file_patterns": {json.dumps(dict(k)): n for k, n in by_file.items()}}


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def report(r: dict) -> None:
    """The four tables, in markdown."""
    gb = r["bytes"] / 1e9
    print(f"store: {r['cells']} cells, {r['files']} files, {gb:.3f} GB (int32 LZ4, data chunk files of "
          f"{r['chunk_mb']} MiB of ids); moto_server on 127.0.0.1; {r['machine']}; commit {r['commit']}; every "
          f"pin the same manifest sha256 {r['manifest_sha256'][:12]}...\n")
    floor = statistics.median(x["cpu"] for x in r["cpu"][FLOOR]) / gb
    print(f"| client CPU (median of {r['repeats']}) | core-s per GB | spread | vs sha256sum | GB/s wall | load |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in r["cpu"].items():
        per_gb = [x["cpu"] / gb for x in runs]
        print(f"| {name} | {statistics.median(per_gb):.2f} | {_spread(per_gb)} | "
              f"{statistics.median(per_gb) / floor:.2f} | {gb / statistics.median(x['wall'] for x in runs):.3f} | "
              f"{statistics.median(x['load'] for x in runs):.2f} |")
    print(f"\n| adopt, wall clock (median of {r['repeats']}) | GB/s | spread | start-up s (apart) | load |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in r["ray"].items():
        rates = [gb / x["wall"] for x in runs]
        label = f"--engine ray, local instance of {name.split()[1]} CPUs" if name != "local" else "--engine local"
        startup, load = (statistics.median(x[k] for x in runs) for k in ("startup", "load"))
        print(f"| {label} | {statistics.median(rates):.3f} | {_spread(rates)} | {startup:.1f} | {load:.2f} |")
    print("\n| structural checks alone, per cell | chunk files | requests | bytes read | of which | wall s | load |")
    print("|---|---:|---|---:|---|---:|---:|")
    for c in r["checks"]:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(c["requests"].items()))
        parts = "; ".join(f"{k}: {n:,} B in {c['reads'][k]} reads" for k, n in sorted(c["bytes"].items()))
        print(f"| {c['cell']} | {c['chunk_files']} | {kinds} | {sum(c['bytes'].values()):,} | {parts} | "
              f"{c['wall']:.2f} | {c['load']:.2f} |")
    a = r["adopt_requests"]
    print("\n| whole adopt, requests per cell | files | requests |")
    print("|---|---:|---|")
    for cell, kinds in a["per_cell"].items():
        print(f"| {cell} | {a['files_per_cell'].get(cell, 0)} | "
              f"{', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))} |")
    print("\nrequests per file (pattern: files): " + "; ".join(f"{k}: {n}" for k, n in a["per_file_patterns"].items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=1200, help="MB of int32 token ids before LZ4 (1e6 bytes)")
    ap.add_argument("--cells", type=int, default=4)
    ap.add_argument("--chunk-mb", type=int, default=32, help="MiB of ids per data chunk file (before LZ4)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ray", type=int, nargs="*", default=[1, 2, 4], help="local Ray instance sizes (CPUs)")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-pin-"))
    os.environ.update(LOCAL_S3_ENV, MOTO_RECORDER_FILEPATH=str(tmp / "moto-requests.jsonl"))
    os.environ.pop("AWS_PROFILE", None)
    try:
        with local_s3_server() as endpoint:
            build_store(tmp / "store", args.mb, args.cells, args.chunk_mb)
            create_bucket(endpoint, BUCKET)
            sizes = upload(tmp / "store", endpoint)
            tokenizer = wide_tokenizer(tmp / "tok")
            cells = sorted({"/".join(p.split("/")[:2]) for p in sizes})
            digests: set[str] = set()
            result = {"machine": machine(), "commit": _commit(), "bytes": sum(sizes.values()), "files": len(sizes),
                      "cells": len(cells), "chunk_mb": args.chunk_mb, "repeats": args.repeats,
                      "checks": check_figures(endpoint, cells),
                      "adopt_requests": adopt_requests(endpoint, tokenizer, tmp / "pin", sizes),
                      "cpu": cpu_figures(endpoint, tokenizer, tmp / "store", sizes, args.repeats, tmp / "pin", digests),
                      "ray": ray_figures(endpoint, tokenizer, args.repeats, args.ray, tmp / "pin", digests)}
        if len(digests) != 1:
            raise RuntimeError(f"the runs pinned different manifests: {sorted(digests)}")
        result["manifest_sha256"] = digests.pop()
        report(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1, default=dict))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


if __name__ == "__main__":
    main()
