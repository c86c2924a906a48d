"""The loader from a pinned Levanter store vs the same tokens as a Parquet corpus, side by side in one run.

The same documents (random ids below a Llama-3 vocabulary, log-normal lengths, median ~660 tokens, EOS
after each) are written twice: as a Parquet corpus (`write_shard`, ``--shards`` shards per subset) and as a
store of Levanter caches (`write_cache`, one cell per subset, Levanter's array specs with the chunk grid
shrunk to ``--chunk`` elements so that a cell has several chunk files), which `adopt` pins in place. Three
subsets/cells, weights 0.5/0.3/0.2, batch 8 x 4096, the default hierarchical shuffle and packing.

- **steady state**: every shard already decoded into the loader's local form (the same uint32 memory maps
  either way) and warm in the page cache; a loop that only takes batches, in-process (`bench_loader`'s
  `loader_rate`). The cache's figure over the Parquet corpus's is the ratio that matters (>= 0.9).
- **first pass**: a fresh decode cache; every shard decoded with `DecodedShardCache.ensure` (SHA-256 of the
  file, decode, ``.npy`` files written and fsynced, seal), source files warm in the page cache: a Parquet
  shard's ``tokens`` column against a data chunk file's blosc inner chunks (and its part's offsets).

Each repeat measures both sources in an order rotated per repeat; figures are medians with min-max.

    .venv/bin/python benchmarks/bench_loader_cache.py                       # 3 x 32M tokens, 5 repeats
    .venv/bin/python benchmarks/bench_loader_cache.py --codec zstd --dtype int64   # the newer generation
    .venv/bin/python benchmarks/bench_loader_cache.py --tokens 4000000 --chunk 1048576 --steps 100 --repeats 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Manifest, load_corpus
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import shard_path, write_shard
from marin_data.layout import TOKENIZER
from marin_data.levanter import LZ4, ZSTD, adopt, write_cache
from marin_data.loader import LoaderConfig, TokenStream
from marin_data.raw.tokenizer import TokenizerInfo

sys.path.insert(0, str(Path(__file__).parent))
from bench_loader import BATCH, SEQ_LEN, VOCAB, loader_rate  # noqa: E402

CELLS = {"cluster=0/quality=4": 0.5, "cluster=1/quality=4": 0.3, "cluster=2/quality=4": 0.2}


def documents(tokens: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs, total = [], 0
    while total < tokens:
        n = int(max(1, rng.lognormal(6.5, 1.0)))
        doc = rng.integers(1, VOCAB, n + 1, dtype=np.uint32)
        doc[-1] = 0
        docs.append(doc)
        total += len(doc)
    return docs


def build(root: Path, tokens: int, shards: int, chunk: int, dtype: str, codec) -> None:
    """``root/parquet`` and ``root/store`` (pinned) holding the same documents."""
    tok = json.dumps({"model": {"type": "benchmark", "vocab_size": VOCAB}}).encode()
    (root / "parquet").mkdir(parents=True)
    (root / "parquet" / TOKENIZER).write_bytes(tok)
    info = TokenizerInfo("benchmark", hashlib.sha256(tok).hexdigest(), vocab_size=VOCAB, eos_id=0)
    records = []
    for i, cell in enumerate(CELLS):
        docs = documents(tokens, i)
        write_cache(root / "store" / cell, docs, dtype=dtype, codec=codec, chunk=chunk)
        for n, part in enumerate(np.array_split(np.arange(len(docs)), shards)):
            piece = [docs[d] for d in part]
            offsets = np.concatenate([[0], np.cumsum([len(d) for d in piece])]).astype(np.int64)
            st = write_shard(root / "parquet" / shard_path(cell, n), [str(d) for d in part], np.concatenate(piece),
                             offsets, info)
            records.append(ShardRecord(shard_path(cell, n), cell, st.bytes, st.sha256, st.docs, st.tokens,
                                       st.row_groups))
    commit_corpus(root / "parquet", Manifest("bench", "0", info, {c: SubsetInfo(0, 0, 0, 0) for c in CELLS}), records)
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel()
    t.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"]))
    (root / "tok").mkdir()
    t.save(str(root / "tok" / "tokenizer.json"))
    adopt(root / "store", tokenizer=str(root / "tok"))


def stream_of(source: Path, cache: Path) -> TokenStream:
    return TokenStream(source, LoaderConfig(seq_len=SEQ_LEN, batch_size=BATCH, mixture=CELLS), cache_dir=cache)


def decode_all(stream: TokenStream) -> float:
    """Seconds to decode every shard of ``stream`` into its (fresh) decode cache, the files warm."""
    for shard in stream.corpus.shards:
        (stream.corpus.root / shard.path).read_bytes()
    t0 = time.perf_counter()
    for shard in stream.shards:
        stream.source.ensure(shard)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32_000_000, help="tokens per subset (3 subsets)")
    ap.add_argument("--shards", type=int, default=2, help="Parquet shards per subset")
    ap.add_argument("--chunk", type=int, default=1 << 24, help="elements per chunk file of the caches")
    ap.add_argument("--dtype", default="int32", choices=["int32", "int64"])
    ap.add_argument("--codec", default="lz4", choices=["lz4", "zstd"])
    ap.add_argument("--steps", type=int, default=1000, help="batches timed per steady-state measurement")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-cache-"))
    sources = {"parquet": tmp / "parquet", "cache": tmp / "store"}
    try:
        build(tmp, args.tokens, args.shards, args.chunk, args.dtype, {"lz4": LZ4, "zstd": ZSTD}[args.codec])
        total = sum(s.tokens for s in load_corpus(sources["parquet"]).shards)
        decode = {k: [] for k in sources}
        steady = {k: [] for k in sources}
        for name, src in sources.items():  # imports, first calls and the page cache are not the first pass
            decode_all(stream_of(src, tmp / f"decode-{name}-warmup"))
            shutil.rmtree(tmp / f"decode-{name}-warmup")
        for rep in range(args.repeats):
            order = list(sources)[rep % 2:] + list(sources)[:rep % 2]
            for name in order:  # first pass: a fresh decode cache each time
                cache = tmp / f"decode-{name}-{rep}"
                decode[name].append(total / decode_all(stream_of(sources[name], cache)))
                shutil.rmtree(cache)
        warm = {name: stream_of(src, tmp / f"warm-{name}") for name, src in sources.items()}
        for stream in warm.values():
            decode_all(stream)
            for f in stream.source.cache_dir.rglob("*.npy"):
                f.read_bytes()
        for rep in range(args.repeats):
            order = list(sources)[rep % 2:] + list(sources)[:rep % 2]
            start = 100_000 + rep * args.steps * BATCH  # fresh positions each repeat, the same for both
            for name in order:
                steady[name].append(loader_rate(warm[name], start, args.steps, warmup=20)[0])
    finally:
        shutil.rmtree(tmp)
    ratio = {what: [c / p for c, p in zip(rows["cache"], rows["parquet"])] for what, rows in
             (("steady", steady), ("decode", decode))}
    med = {what: {k: statistics.median(v) for k, v in rows.items()} for what, rows in
           (("steady", steady), ("decode", decode))}
    print(json.dumps({
        "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "tokens": total, "cache": f"{args.dtype}/{args.codec}, chunk {args.chunk}",
        "parquet_shards": 3 * args.shards,
        "median_M_tokens_per_s": {w: {k: round(v / 1e6, 1) for k, v in m.items()} for w, m in med.items()},
        "cache_over_parquet": {w: {"median": round(statistics.median(r), 3), "min": round(min(r), 3),
                                   "max": round(max(r), 3), "runs": [round(x, 3) for x in r]}
                               for w, r in ratio.items()},
        "runs_M_tokens_per_s": {w: {k: [round(x / 1e6, 1) for x in v] for k, v in rows.items()} for w, rows in
                                (("steady", steady), ("decode", decode))},
    }, indent=2))


if __name__ == "__main__":
    main()
