"""Time the trainer waits for data: ``marin-train`` on ``tiny`` streaming from S3 and from a Hub mirror.

The sample corpus (``marin-data sample``; built if ``--corpus`` does not exist) is published to a moto S3
server and served by ``marin-data serve``, each in its own process on 127.0.0.1. For each source, the tiny
model trains ``--steps`` steps twice through `marin_train.run.run_training` (the ``marin-train`` path):
*cold* with an empty shard cache (every shard is fetched, verified and decoded on the way), then *warm*
with the cache the cold run filled (a fresh run from step 0; nothing is fetched). The figure is the sum
of the time spent in the loader's ``next()`` over the sum of step times, from step 2 and from step 1
(which also waits for the first fetches); the time to the first step (reading the manifest and index,
building the stream and the model, step 1) is shown apart. Goal: under 1% warm.

The sample fits the cache, so these runs never evict. A *quarter* run streams a corpus made for it (the
first 128K tokens of the sample's ``prose/docstrings`` cut into 32 shards, so that a quarter of it still
holds the loader's working set of ``shuffle_window`` shards) through a cache of a quarter of its footprint
for ``--passes`` passes: every pass fetches again what the cache evicted.

    .venv/bin/python benchmarks/bench_train_data_wait.py --steps 200              # the record
    .venv/bin/python benchmarks/bench_train_data_wait.py --steps 20 --quick       # quick check (S3 only)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIXTURE = {"code/*": 0.5, "prose/*": 0.4, "reference/*": 0.1}
QUARTER_SUBSET, QUARTER_TOKENS, QUARTER_SHARDS = "prose/docstrings", 1 << 17, 32


def run(source: str, cache_dir: Path, steps: int, store_options: dict, *, mixture: dict | None = MIXTURE,
        cache_bytes: int = 64 << 20) -> dict:
    from marin_train.run import run_training
    from marin_train.config import TRAIN_PRESETS, DataConfig

    cfg = dataclasses.replace(TRAIN_PRESETS["tiny"], steps=steps, log_every=10**9, data=DataConfig(
        source=source, mixture=mixture, cache_dir=str(cache_dir), cache_bytes=cache_bytes,
        store_options=store_options))
    lines: list[str] = []
    first: list[float] = []

    def log(line: str) -> None:  # step 1 is always logged: the time to the first step
        if not first and line.startswith("step "):
            first.append(time.perf_counter() - t0)
        lines.append(line)

    t0 = time.perf_counter()
    records = run_training(cfg, resume=False, log=log).records
    wall = time.perf_counter() - t0
    rest = records[1:]
    return {"to_first": first[0], "first_wait": records[0]["data_wait"], "first_step": records[0]["seconds"],
            "all_wait": sum(r["data_wait"] for r in records), "all_step": sum(r["seconds"] for r in records),
            "wait": sum(r["data_wait"] for r in rest), "step": sum(r["seconds"] for r in rest),
            "tok_s": sum(r["tokens"] for r in rest) / sum(r["seconds"] for r in rest), "wall": wall,
            "cache": next((line for line in lines if line.startswith("shard cache")), "")}


def quarter_corpus(sample: Path, dest: Path) -> tuple[int, int]:
    """Write the quarter run's corpus (see the module docstring); return (steps per pass, cache bytes)."""
    import numpy as np

    from marin_data.corpus.commit import commit_corpus
    from marin_data.corpus.manifest import Manifest, load_corpus
    from marin_data.corpus.records import ShardRecord, SubsetInfo
    from marin_data.corpus.shard import read_shard, shard_path, write_shard
    from marin_data.layout import TOKENIZER
    from marin_data.loader.remote.budget import decoded_bytes
    from marin_train.config import TRAIN_PRESETS

    corpus = load_corpus(sample)
    docs: list[tuple[str, np.ndarray]] = []
    for shard in corpus.shards_of([QUARTER_SUBSET]):
        ids, tokens, offsets = read_shard(sample / shard.path)
        docs += [(i, tokens[a:b]) for i, a, b in zip(ids, offsets, offsets[1:])]
    ends = np.cumsum([len(t) for _, t in docs])
    docs = docs[:int(np.searchsorted(ends, QUARTER_TOKENS)) + 1]
    cuts = np.searchsorted(ends[:len(docs)], np.arange(1, QUARTER_SHARDS) * ends[len(docs) - 1] / QUARTER_SHARDS)
    dest.mkdir(parents=True)
    shutil.copyfile(sample / TOKENIZER, dest / TOKENIZER)
    records = []
    for n, part in enumerate(np.split(np.arange(len(docs)), cuts)):
        tokens = [docs[i][1] for i in part]
        offsets = np.concatenate([[0], np.cumsum([len(t) for t in tokens])]).astype(np.int64)
        rel = shard_path(QUARTER_SUBSET, n)
        st = write_shard(dest / rel, [docs[i][0] for i in part], np.concatenate(tokens), offsets,
                         corpus.manifest.tokenizer)
        records.append(ShardRecord(rel, QUARTER_SUBSET, st.bytes, st.sha256, st.docs, st.tokens, st.row_groups))
    info = corpus.manifest.subsets[QUARTER_SUBSET]
    commit_corpus(dest, Manifest("quarter", "0", corpus.manifest.tokenizer,
                                 {QUARTER_SUBSET: SubsetInfo(0, 0, 0, 0, license=info.license)}), records)
    tiny = TRAIN_PRESETS["tiny"]
    windows = sum((r.tokens - 1) // tiny.seq_len for r in records)
    return windows // tiny.batch_size, sum(r.bytes + decoded_bytes(r) for r in records) // 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT / "out" / "quickstart" / "sample")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--passes", type=int, default=3, help="passes of the quarter run")
    parser.add_argument("--quick", action="store_true", help="S3 only")
    args = parser.parse_args()

    from marin_data.corpus.sample import build_sample
    from marin_data.testing.local_s3 import LOCAL_S3_ENV, create_bucket, local_s3_server
    from marin_data.testing.mirror import mirror_process
    from marin_data.transfer.publish_s3 import publish

    if not (args.corpus / "manifest.json").exists():
        build_sample(args.corpus)
    os.environ.update(LOCAL_S3_ENV)
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    rows = []
    try:
        copy = work / "hub" / "marin" / "sample"
        shutil.copytree(args.corpus, copy)
        per_pass, quarter_bytes = quarter_corpus(args.corpus, work / "hub" / "marin" / "quarter")
        quarter = {"mixture": None, "cache_bytes": quarter_bytes}
        with local_s3_server() as endpoint:
            create_bucket(endpoint, "bench-train")
            publish(copy, to="s3://bench-train/sample", endpoint_url=endpoint, progress=False)
            publish(work / "hub" / "marin" / "quarter", to="s3://bench-train/quarter", endpoint_url=endpoint,
                    progress=False)
            for temp in ("cold", "warm"):
                rows.append(("S3 (moto)", temp, run("s3://bench-train/sample", work / "cache-s3", args.steps,
                                                    {"endpoint_url": endpoint})))
            rows.append(("S3 (moto)", "quarter", run("s3://bench-train/quarter", work / "cache-s3-quarter",
                                                     args.passes * per_pass, {"endpoint_url": endpoint}, **quarter)))
        if not args.quick:
            with mirror_process(work / "hub") as url:
                for temp in ("cold", "warm"):
                    rows.append(("marin-data serve (hf://)", temp, run("hf://datasets/marin/sample", work / "cache-hf",
                                                                       args.steps, {"endpoint": url})))
                rows.append(("marin-data serve (hf://)", "quarter", run(
                    "hf://datasets/marin/quarter", work / "cache-hf-quarter", args.passes * per_pass,
                    {"endpoint": url}, **quarter)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\ntiny, 8 x 64 tokens a step, torch threads {__import__('torch').get_num_threads()}, {os.cpu_count()} CPUs; "
          f"cold/warm: {args.steps} steps, mixture {MIXTURE}, 64 MiB shard cache; quarter: {args.passes} passes "
          f"({args.passes * per_pass} steps) over {QUARTER_SHARDS} shards of {QUARTER_SUBSET}, "
          f"{quarter_bytes / 2**20:.2f} MiB shard cache")
    print("| source | cache | time to first step | data wait, steps 2-N | data wait, steps 1-N | first step: wait / "
          "step | tokens/s | run wall |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for source, temp, r in rows:
        print(f"| {source} | {temp} | {r['to_first']:.2f} s | {r['wait'] / r['step']:.2%} ({r['wait'] * 1e3:.0f} ms "
              f"of {r['step']:.1f} s) | {r['all_wait'] / r['all_step']:.2%} | {r['first_wait']:.2f} s / "
              f"{r['first_step']:.2f} s | {r['tok_s']:,.0f} | {r['wall']:.1f} s |")
    for source, temp, r in rows:
        print(f"{source}, {temp}: {r['cache']}")


if __name__ == "__main__":
    sys.exit(main())
