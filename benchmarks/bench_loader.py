"""The loader: tokens/s delivered to a training loop vs the memory-map floor, first pass from
Parquet vs the decode floor, and start-up over a 100,000-shard index.

Setup: 3 subsets with weights 0.5/0.3/0.2, hierarchical shuffle, batch 8 x 4096, warm page
cache, shards already decoded (the loader's local form: uint32 memory maps). The corpus is written with the
real shard writer: random token ids below a Llama-3 vocabulary, log-normal document lengths (median ~660
tokens), EOS after each document.

- **floor**: the same sequences (the loader's own order, computed beforehand) copied with numpy from one
  memory map per subset into a preallocated ``[8, 4097]`` int64 batch: the cheapest way to deliver them.
- **loader**: `TokenDataset` iterated by a loop that only takes each batch, in-process (the default batch,
  then with ``segments=True``), with the prefetch thread, and through 2 DataLoader worker processes for
  context. "CPU per step" is the process's CPU time (all threads) per batch. Then a loop that sleeps 2 ms
  per batch (a GPU step: the GIL released) times how long each ``next`` waits.
- **first pass**: a fresh decode cache, one pass worth of sequences: Parquet decode, writing the ``.npy``
  files and serving, vs reading every shard's ``tokens`` column (the one the loader decodes) with
  ``pyarrow.parquet.read_table`` (the decode floor); and the decode alone (``ParquetDecoder.decode_into``,
  no hash) on one thread and on its default number of threads.
- **start-up**: `TokenStream` over `simulate.simulated_corpus` (23T tokens, 100,000 shards, 200 subsets)
  in memory, and from an index on disk (`load_corpus` included); wall time and peak traced memory.

Each repeat runs floor and loader back to back; figures are medians over repeats.

    .venv/bin/python benchmarks/bench_loader.py                                   # the record
    .venv/bin/python benchmarks/bench_loader.py --tokens 4000000 --steps 200 --repeats 1 --shards 2000   # quick
    .venv/bin/python benchmarks/bench_loader.py --startup-only      # the start-up line alone, as JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import shard_path, write_shard
from marin_data.formats.marin.decode import ParquetDecoder, decode_threads
from marin_data.layout import TOKENIZER
from marin_data.loader import LoaderConfig, TokenDataset, TokenLoader, TokenStream
from marin_data.raw.tokenizer import TokenizerInfo
from marin_data.testing.simulate import simulated_corpus, write_simulated_index

VOCAB = 128_256
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
SEQ_LEN, BATCH = 4096, 8
STEP_S = 0.002  # a simulated training step (GPU time)


def make_corpus(root: Path, tokens_per_subset: int, shards_per_subset: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    tok_json = json.dumps({"model": {"type": "benchmark", "vocab_size": VOCAB}}).encode()
    root.mkdir(parents=True, exist_ok=True)
    (root / TOKENIZER).write_bytes(tok_json)
    tokenizer = TokenizerInfo("benchmark", hashlib.sha256(tok_json).hexdigest(), vocab_size=VOCAB, eos_id=0)
    records = []
    for subset in WEIGHTS:
        for n in range(shards_per_subset):
            lengths = np.maximum(1, rng.lognormal(6.5, 1.0, size=tokens_per_subset // shards_per_subset // 1100))
            offsets = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) + 1)])
            tokens = rng.integers(1, VOCAB, size=int(offsets[-1]), dtype=np.uint32)
            tokens[offsets[1:] - 1] = 0
            rel = shard_path(subset, n)
            st = write_shard(root / rel, [str(i) for i in range(len(lengths))], tokens, offsets, tokenizer)
            records.append(ShardRecord(rel, subset, st.bytes, st.sha256, st.docs, st.tokens, st.row_groups))
    commit_corpus(root, Manifest("bench", "0", tokenizer, {s: SubsetInfo(0, 0, 0, 0) for s in WEIGHTS}), records)


def floor_rate(stream: TokenStream, maps: list[np.ndarray], start: int, steps: int) -> float:
    """numpy copies of the loader's sequences from one memory map per subset into a preallocated batch."""
    subset, first = (a.tolist() for a in stream.locate(np.arange(start, start + steps * BATCH)))
    out = np.empty((BATCH, SEQ_LEN + 1), np.int64)
    t0 = time.perf_counter()
    for step in range(steps):
        for r in range(BATCH):
            k = step * BATCH + r
            out[r] = maps[subset[k]][first[k] : first[k] + SEQ_LEN + 1]
    return steps * BATCH * SEQ_LEN / (time.perf_counter() - t0)


def loader_rate(stream: TokenStream, start: int, steps: int, *, prefetch: int = 0, workers: int = 0,
                step_s: float = 0.0, warmup: int = 1) -> tuple[float, float, float]:
    """(tokens/s, CPU seconds per step, seconds per step spent waiting in ``next``) of a loop that takes
    ``steps`` batches from the loader.

    ``step_s``: the loop also "trains" that long per batch, in ``time.sleep``, which releases the GIL as a
    training step waiting on its GPU does (the wait is timed around ``next`` alone: a sleep overshoots).
    """
    dataset = TokenDataset(stream, position=start, prefetch=prefetch)
    loader = TokenLoader(dataset, num_workers=workers, prefetch_factor=4)
    it = iter(loader)
    for _ in range(2 * workers + warmup):  # start-up (threads, worker processes, first maps) is not steady state
        next(it)
    t0, c0, waited = time.perf_counter(), time.process_time(), 0.0
    for _ in range(steps):
        if step_s:
            tw = time.perf_counter()
            next(it)
            waited += time.perf_counter() - tw
            time.sleep(step_s)
        else:
            next(it)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    del it
    return steps * BATCH * SEQ_LEN / wall, cpu / steps, waited / steps


def decoded_stream(root: Path, cache: Path, seed: int = 0, segments: bool = False) -> tuple[TokenStream, float]:
    """The benchmark's stream with every shard decoded into ``cache`` and warm in the page cache, and the
    seconds the decoding took."""
    stream = TokenStream(root, LoaderConfig(seq_len=SEQ_LEN, batch_size=BATCH, mixture=WEIGHTS, seed=seed,
                                            segments=segments), cache_dir=cache)
    t0 = time.perf_counter()
    for shard in stream.corpus.shards:
        stream.source.ensure(shard)
    decode_s = time.perf_counter() - t0
    for f in cache.rglob("*.npy"):
        f.read_bytes()
    return stream, decode_s


def steady_state(root: Path, cache: Path, steps: int, repeats: int) -> dict:
    stream, decode_s = decoded_stream(root, cache)
    # The floor reads one memory map per subset (the decoded shards concatenated), warm in the page cache.
    maps = []
    for sub in stream.subset_tokens:
        path = cache / f"floor-{sub.name}.npy"
        whole = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint32, shape=(sub.tokens,))
        for shard, lo in zip(sub.shards, sub.cumulative):
            part = stream.source.open(shard).tokens
            whole[lo : lo + len(part)] = part
        whole.flush()
        maps.append(np.asarray(np.load(path, mmap_mode="r")))  # a plain ndarray: no memmap subclass overhead
        path.read_bytes()  # warm page cache
    with_segments = TokenStream(root, dataclasses.replace(stream.config, segments=True), source=stream.source)
    rows: dict[str, list] = {k: [] for k in ("floor", "sync", "sync_cpu", "segments", "segments_cpu", "thread",
                                              "thread_cpu", "workers2", "sync_wait", "thread_wait")}
    for rep in range(repeats):
        start = 1_000_000 + rep * steps * BATCH * 5  # fresh positions each repeat, as training would read
        rows["floor"].append(floor_rate(stream, maps, start, steps))
        rate, cpu, _ = loader_rate(stream, start, steps)
        rows["sync"].append(rate)
        rows["sync_cpu"].append(cpu)
        rate, cpu, _ = loader_rate(with_segments, start + 4 * steps * BATCH, steps)
        rows["segments"].append(rate)
        rows["segments_cpu"].append(cpu)
        rate, cpu, _ = loader_rate(stream, start + steps * BATCH, steps, prefetch=2)
        rows["thread"].append(rate)
        rows["thread_cpu"].append(cpu)
        rows["workers2"].append(loader_rate(stream, start + 2 * steps * BATCH, steps, workers=2)[0])
        for k, prefetch in (("sync_wait", 0), ("thread_wait", 2)):  # what a 2 ms training step waits for data
            rows[k].append(loader_rate(stream, start + 3 * steps * BATCH, steps // 4, prefetch=prefetch,
                                       step_s=STEP_S)[2])
    out = {k: statistics.median(v) for k, v in rows.items()}
    out["decode_all_s"] = decode_s
    return out


def first_pass(root: Path, tmp: Path) -> dict:
    import pyarrow.parquet as pq

    corpus = load_corpus(root)
    total = sum(s.tokens for s in corpus.shards)
    for s in corpus.shards:
        (root / s.path).read_bytes()  # Parquet warm in the page cache for both
    t0 = time.perf_counter()
    for s in corpus.shards:
        pq.read_table(root / s.path, columns=["tokens"]).column("tokens").combine_chunks()  # what the loader reads
    floor = total / (time.perf_counter() - t0)
    decode = {}
    for threads in (1, decode_threads()):  # the loader's decode alone, no hash: one thread, then its default
        t0 = time.perf_counter()
        for s in corpus.shards:
            ParquetDecoder(threads=threads).decode_into(root / s.path, s, tmp / "t.npy", tmp / "o.npy", verify=False)
        decode[threads] = total / (time.perf_counter() - t0)
    cache = tmp / "cold-cache"
    stream = TokenStream(corpus, LoaderConfig(seq_len=SEQ_LEN, batch_size=BATCH, mixture=WEIGHTS), cache_dir=cache)
    steps = total // (SEQ_LEN * BATCH)
    dataset = TokenDataset(stream, prefetch=2)
    t0 = time.perf_counter()
    for k, _ in enumerate(dataset, 1):
        if k == steps:
            break
    loader = steps * BATCH * SEQ_LEN / (time.perf_counter() - t0)
    stream.source.wait()
    decoded = sum(1 for _ in cache.rglob("tokens.npy"))
    shutil.rmtree(cache)
    return {"floor": floor, "loader": loader, "shards_decoded": decoded, "shards": len(corpus.shards),
            "decode": decode}


def startup(tmp: Path, shards: int) -> dict:
    config = LoaderConfig(mixture={"pre": 0.8, "mid/*": 0.2})
    corpus = simulated_corpus(shards=shards, subsets=min(200, shards))
    TokenStream(corpus, config)  # imports and first-call costs are not start-up
    out = {"shards": len(corpus.shards), "tokens": sum(s.tokens for s in corpus.shards)}
    t0 = time.perf_counter()
    TokenStream(corpus, config)
    out["memory_s"] = time.perf_counter() - t0
    tracemalloc.start()
    TokenStream(corpus, config)
    out["memory_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    write_simulated_index(tmp / "index", shards=shards, subsets=min(200, shards))
    t0 = time.perf_counter()
    TokenStream(tmp / "index", config)
    out["disk_s"] = time.perf_counter() - t0
    tracemalloc.start()
    TokenStream(tmp / "index", config)
    out["disk_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return out


def rate_of(root: Path, cache: Path, steps: int, seed: int, warmup: int, segments: bool) -> dict:
    """One in-process measurement for ``bench_loader_peers.py`` (which runs it in a fresh process): the
    loader over ``root``'s shards, decoded into ``cache`` first (outside the timing), warm page cache."""
    rate, cpu, _ = loader_rate(decoded_stream(root, cache, seed, segments)[0], 1_000_000, steps, warmup=warmup)
    return {"tokens_per_s": rate, "cpu_per_step": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64_000_000, help="tokens per subset (3 subsets)")
    ap.add_argument("--shards-per-subset", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2000, help="batches timed per measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shards", type=int, default=100_000, help="shards in the simulated start-up index")
    ap.add_argument("--startup-only", action="store_true", help="measure start-up alone and print it as JSON")
    ap.add_argument("--keep", type=Path, help="build the corpus here and keep it (for bench_loader_peers.py)")
    ap.add_argument("--rate-of", type=Path, metavar="CORPUS", help=argparse.SUPPRESS)  # bench_loader_peers.py's
    ap.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--segments", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rate_of:
        print(json.dumps(rate_of(args.rate_of, args.cache, args.steps, args.seed, args.warmup, args.segments)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    root = args.keep or tmp / "corpus"
    if args.startup_only:
        try:
            print(json.dumps(startup(tmp, args.shards)))
        finally:
            shutil.rmtree(tmp)
        return
    try:
        if not (root / "manifest.json").exists():
            make_corpus(root, args.tokens, args.shards_per_subset)
        steady = steady_state(root, tmp / "cache", args.steps, args.repeats)
        cold = first_pass(root, tmp)
        start = startup(tmp, args.shards)
    finally:
        shutil.rmtree(tmp)
    m = 1e6
    print(f"\n{platform.processor() or platform.machine()}, {args.tokens * 3 / 1e6:.0f}M tokens in "
          f"{args.shards_per_subset * 3} shards, batch {BATCH} x {SEQ_LEN}, weights 0.5/0.3/0.2, "
          f"{args.steps} steps, median of {args.repeats}\n")
    print("| what | M tokens/s | vs floor | CPU per step |\n|---|---:|---:|---:|")
    print(f"| floor: numpy copies from a memory map | {steady['floor'] / m:.0f} | 1.00 | |")
    for key, label in (("sync", "loader, in-process"), ("segments", "loader, in-process, segments=True"),
                       ("thread", "loader, in-process + prefetch thread")):
        print(f"| {label} | {steady[key] / m:.0f} | {steady[key] / steady['floor']:.2f} | "
              f"{steady[key + '_cpu'] * 1e6:.0f} us |")
    print(f"| loader, 2 DataLoader worker processes | {steady['workers2'] / m:.0f} | "
          f"{steady['workers2'] / steady['floor']:.2f} | |")
    print(f"\nA loop whose steps take {STEP_S * 1e3:.0f} ms with the GIL released (a GPU step) waits "
          f"{steady['sync_wait'] * 1e6:.0f} us per step for data in-process, "
          f"{steady['thread_wait'] * 1e6:.0f} us with the prefetch thread")
    print(f"\nFirst pass from Parquet ({cold['shards_decoded']}/{cold['shards']} shards decoded on the way): "
          f"loader {cold['loader'] / m:.0f}M tokens/s vs pyarrow decode floor {cold['floor'] / m:.0f}M tokens/s "
          f"({cold['loader'] / cold['floor']:.2f}); decoding every shard up front took {steady['decode_all_s']:.1f} s")
    print("The decode alone (no hash) on " + ", ".join(f"{n} thread{'s' * (n > 1)}: {r / m:.0f}M tokens/s "
                                                       f"({r / cold['floor']:.2f})" for n, r in cold["decode"].items()))
    print(f"\nStart-up over {start['shards']:,} shards / {start['tokens'] / 1e12:.0f}T tokens: "
          f"{start['memory_s']:.2f} s and {start['memory_peak_mb']:.0f} MB peak from an in-memory index; "
          f"{start['disk_s']:.2f} s and {start['disk_peak_mb']:.0f} MB with load_corpus from disk")


if __name__ == "__main__":
    main()
