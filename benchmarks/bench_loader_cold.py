"""The first epoch from object storage: marin, LitData and MosaicML streaming reading the same tokens cold from
one S3 server, next to a plain boto3 GET of each format's objects.

Setup: a corpus from ``bench_loader.py --keep DIR`` (subsets web/code/math at 0.5/0.3/0.2), converted once by
``bench_loader_peers.py`` (MDS shards and LitData chunks of the windows marin serves), all three uploaded
to one moto S3 server on 127.0.0.1 (marin's corpus with its own ``publish``). Every measurement is a fresh
process with an empty cache, in an order rotated each repeat; batch 8 x 4096 (``--steps`` more than an epoch
holds go on into the next, from the cache). Per run: the time from making
the loader to its first batch (store clients, metadata, the first shards fetched), the tokens/s of the
batches after it, and of the whole run. The **GET floor** of a format is one process reading each of its
objects whole with boto3, one at a time (median of 3, rotated): what its bytes cost to receive from this
server.

The peers run in their own environment (``bench_loader_peers.sh`` makes it: ``--peers-python``); this script
and marin run in marin's. LitData fetches chunks through obstore, whose client refuses an ``http://``
endpoint unless its options allow HTTP, and LitData (0.2.76) builds that client with fixed options
(``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS``) that ``storage_options`` does not reach: its runs
add ``allow_http`` to them, so its chunks still come through obstore, as from an ``https://`` store, and pass
``storage_options={"endpoint_url": ...}`` for its boto3 client (the index files). MosaicML reads the
endpoint from ``S3_ENDPOINT_URL``.

    .venv/bin/python benchmarks/bench_loader_cold.py --corpus /tmp/bench-loader-corpus \\
        --peers-python /tmp/peers-venv/bin/python --steps 2500 --repeats 3 --workers 0 2

``--throttle 100e6 4`` puts ``throttle_proxy.py`` between the server and every reader (loaders and GET
floors; the uploads go straight to the server): each connection paced to 100 MB/s, at most 4 moving bytes
at once, as a real bucket's link would be rather than loopback's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
SEQ_LEN, BATCH = 4096, 8
BUCKET = "bench"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def timed(make, steps: int) -> dict:
    """First-batch time and rates of ``steps`` batches from the iterable ``make()`` returns."""
    t0 = time.perf_counter()
    it = iter(make())
    next(it)
    t1 = time.perf_counter()
    for _ in range(steps - 1):
        next(it)
    t2 = time.perf_counter()
    return {"first_batch_s": t1 - t0, "after_first": (steps - 1) * BATCH * SEQ_LEN / (t2 - t1),
            "rate": steps * BATCH * SEQ_LEN / (t2 - t0)}


def marin(endpoint: str, cache: Path, steps: int, workers: int, seed: int) -> dict:
    from marin_data.loader import LoaderConfig
    from marin_data.loader.remote.stream import make_remote_loader

    config = LoaderConfig(seq_len=SEQ_LEN, batch_size=BATCH, mixture=WEIGHTS, seed=seed)
    return timed(lambda: make_remote_loader(f"s3://{BUCKET}/marin", config, cache_dir=cache, endpoint_url=endpoint,
                                            num_workers=workers), steps)


def litdata(endpoint: str, cache: Path, steps: int, workers: int, seed: int) -> dict:
    from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader
    from litdata.streaming.item_loader import TokensLoader
    from litdata.streaming.resolver import Dir

    if hasattr(downloader, "_OBSTORE_CLIENT_OPTIONS"):  # its obstore store's fixed options refuse http://
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    options = {"endpoint_url": endpoint}

    def make():
        parts = [StreamingDataset(input_dir=Dir(path=str(cache / s), url=f"s3://{BUCKET}/litdata/{s}"),
                                  item_loader=TokensLoader(block_size=SEQ_LEN + 1), shuffle=True, seed=seed,
                                  drop_last=True, storage_options=options) for s in WEIGHTS]
        combined = CombinedStreamingDataset(parts, weights=list(WEIGHTS.values()), seed=seed, iterate_over_all=False)
        return StreamingDataLoader(combined, batch_size=BATCH, num_workers=workers)

    return timed(make, steps)


def mosaic(endpoint: str, cache: Path, steps: int, workers: int, seed: int) -> dict:
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    os.environ["S3_ENDPOINT_URL"] = endpoint
    clean_stale_shared_memory()

    def make():
        streams = [Stream(remote=f"s3://{BUCKET}/mds/{s}", local=str(cache / s), proportion=w)
                   for s, w in WEIGHTS.items()]
        dataset = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=seed, batch_size=BATCH)
        return DataLoader(dataset, batch_size=BATCH, num_workers=workers)

    return timed(make, steps)


KINDS = {"marin": marin, "litdata": litdata, "mosaic": mosaic}


def get_floor(endpoint: str, prefix: str) -> tuple[float, int]:
    """Seconds and bytes to GET every object under ``prefix`` whole, one at a time, with one boto3 client."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])]
    t0, size = time.perf_counter(), 0
    for key in keys:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        while chunk := body.read(1 << 20):
            size += len(chunk)
    return time.perf_counter() - t0, size


def upload(endpoint: str, corpus: Path, work: Path) -> None:
    """marin's corpus with its own publish; the peers' converted trees file by file."""
    import boto3

    from marin_data.transfer.publish_s3 import publish

    publish(corpus, to=f"s3://{BUCKET}/marin", endpoint_url=endpoint)
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for fmt in ("litdata", "mds"):
        for path in sorted((work / fmt).rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), BUCKET, f"{fmt}/{path.relative_to(work / fmt).as_posix()}")


def measure(kind: str, workers: int, args, endpoint: str, seed: int) -> dict:
    """One run in a fresh process with an empty cache (marin's Python for marin, the peers' for the peers)."""
    cache = Path(tempfile.mkdtemp(prefix=f"bench-cold-{kind}-"))
    python = sys.executable if kind == "marin" else args.peers_python
    cmd = [python, __file__, "--one", kind, str(workers), endpoint, str(cache), "--steps", str(args.steps),
           "--seed", str(seed)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ, **CREDENTIALS})
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


sys.path.insert(0, str(Path(__file__).parent))
from throttle_proxy import throttled  # noqa: E402 - beside this script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, help="a corpus from bench_loader.py --keep")
    ap.add_argument("--peers-python", help="the Python of bench_loader_peers.sh's environment")
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--throttle", nargs=2, type=float, metavar=("BYTES_PER_S", "CONNECTIONS"),
                    help="read through throttle_proxy.py: each connection paced, at most CONNECTIONS at once")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--one", nargs=4, metavar=("KIND", "WORKERS", "ENDPOINT", "CACHE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:  # a child: one run
        kind, workers, endpoint, cache = args.one
        print(json.dumps(KINDS[kind](endpoint, Path(cache), args.steps, int(workers), args.seed)))
        return
    from marin_data.testing.local_s3 import create_bucket, local_s3_server

    # a SIGTERM unwinds like Ctrl-C, so the servers and the throttling proxy this run started are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    os.environ.update(CREDENTIALS)
    work = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    runs = [(k, w) for w in args.workers for k in args.kinds]
    rows: dict[tuple[str, int], list[dict]] = {run: [] for run in runs}
    try:
        done = subprocess.run([args.peers_python, str(Path(__file__).with_name("bench_loader_peers.py")), "--corpus",
                               str(args.corpus), "--convert-to", str(work)], check=True, capture_output=True, text=True)
        windows = json.loads(done.stdout.strip().splitlines()[-1])
        most = min(int(windows[s] / (w * BATCH)) for s, w in WEIGHTS.items())
        if args.steps > most:  # LitData's combined stream ends when its first subset does
            raise SystemExit(f"--steps {args.steps}: the peers' streams end after about {most} steps of this corpus")
        with local_s3_server() as server, contextlib.ExitStack() as stack:
            create_bucket(server, BUCKET)
            upload(server, args.corpus, work)
            endpoint = server if not args.throttle else stack.enter_context(
                throttled(server, args.throttle[0], int(args.throttle[1])))
            floors = {fmt: [] for fmt in ("marin", "litdata", "mds")}
            for rep in range(3):  # rotated, the median kept: the server's first requests are slower
                for fmt in list(floors)[rep:] + list(floors)[:rep]:
                    floors[fmt].append(get_floor(endpoint, f"{fmt}/"))
            floors = {fmt: sorted(runs)[1] for fmt, runs in floors.items()}
            for rep in range(args.repeats):
                for run in runs[rep % len(runs):] + runs[:rep % len(runs)]:
                    rows[run].append(measure(*run, args, endpoint, rep))
                    r = rows[run][-1]
                    print(f"repeat {rep}: {run[0]}, {run[1]} workers: first batch {r['first_batch_s']:.2f} s, then "
                          f"{r['after_first'] / 1e6:.1f}M tokens/s, run {r['rate'] / 1e6:.1f}M", file=sys.stderr,
                          flush=True)
    finally:
        shutil.rmtree(work)
    report(args, floors, runs, rows)


def report(args, floors: dict, runs: list, rows: dict) -> None:
    tokens = args.steps * BATCH * SEQ_LEN
    link = "loopback" if not args.throttle else \
        f"through throttle_proxy.py: {args.throttle[0] / 1e6:.0f} MB/s per connection, {args.throttle[1]:.0f} at once"
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"{args.steps} steps of {BATCH} x {SEQ_LEN} ({tokens / 1e6:.0f}M tokens), cold, fresh process each, "
          f"median of {args.repeats} rotated; {link}\n")
    print("| format | objects' bytes | boto3 GET, one at a time, median of 3 |\n|---|---:|---:|")
    for fmt, (seconds, size) in floors.items():
        print(f"| {fmt} | {size / 1e6:.0f} MB | {seconds:.2f} s ({size / seconds / 1e6:.0f} MB/s) |")
    lit = {w: statistics.median(r["rate"] for r in rows[k, w]) for k, w in runs if k == "litdata"}
    print("\n| loader | first batch, s (range) | M tokens/s after it | M tokens/s, whole run | vs LitData | "
          "runs (whole run) |")
    print("|---|---:|---:|---:|---:|---|")
    for kind, workers in runs:
        mine = rows[kind, workers]
        med = {k: statistics.median(r[k] for r in mine) for k in mine[0]}
        vs = f"{med['rate'] / lit[workers]:.2f}x" if workers in lit else ""
        each = ", ".join(f"{r['rate'] / 1e6:.1f}" for r in mine)
        first = sorted(r["first_batch_s"] for r in mine)
        print(f"| {kind}, {workers} workers | {med['first_batch_s']:.2f} ({first[0]:.2f}-{first[-1]:.2f}) | "
              f"{med['after_first'] / 1e6:.1f} | "
              f"{med['rate'] / 1e6:.1f} | {vs} | {each} |")


if __name__ == "__main__":
    main()
