"""`marin-data shard` throughput against the tokenizer floor, with 1 and 2 workers.

The floor is bare ``tokenizers`` ``encode_batch`` (no special tokens, as the pipeline encodes) over the
same documents with the same number of cores: one process per core, one tokenizer thread each
(``RAYON_NUM_THREADS=1``), documents already in memory, all processes released together by a barrier;
floor = tokens / (last end - first start). The pipeline's figure is end to end: read jsonl, tokenize,
write and hash shards, commit the manifest. Floor and pipeline run side by side in each repeat on a warm
page cache, each repeat starting with the other one, and the figures are medians over the repeats (the
ratio's median of the per-repeat ratios, with their range), because the machine is shared and noisy.

Everything is offline: the documents are the Python standard library's own source files, cut into
documents of about 4 KB and written as jsonl files in a temporary directory, and a byte-level BPE
tokenizer is trained on them with ``tokenizers``.

    .venv/bin/python benchmarks/bench_shard.py                        # ~24 MB of text, 3 repeats
    .venv/bin/python benchmarks/bench_shard.py --mb 2 --repeats 1     # quick check
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

N_FILES = 8  # input files: enough to keep any number of workers up to 8 busy
DOC_BYTES = 4096


def write_documents(out: Path, total_mb: float) -> list[Path]:
    """Cut the standard library's ``.py`` files into ~4 KB documents and deal them into ``N_FILES`` jsonl files."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    budget = int(total_mb * 1e6)
    files = [out / f"docs-{i:02d}.jsonl" for i in range(N_FILES)]
    handles = [f.open("w", encoding="utf-8") for f in files]
    n = 0
    try:
        for src in sources:
            text = src.read_text(encoding="utf-8", errors="replace")
            for lo in range(0, len(text), DOC_BYTES):
                doc = text[lo : lo + DOC_BYTES]
                if budget <= 0:
                    return files
                handles[n % N_FILES].write(json.dumps({"id": f"{src.name}:{lo}", "text": doc}) + "\n")
                budget -= len(doc.encode())
                n += 1
        return files
    finally:
        for h in handles:
            h.close()


def train_tokenizer(files: list[Path], out: Path, vocab_size: int) -> Path:
    """A byte-level BPE tokenizer (as GPT-2 and Llama 3 use) trained on the benchmark's own documents."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = (json.loads(line)["text"] for f in files for line in f.open(encoding="utf-8"))
    tok.train_from_iterator(texts, trainer)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def _floor_process(tokenizer: str, files: list[str], barrier, results) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool: one core per process
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    docs = [json.loads(line)["text"] for f in files for line in open(f, encoding="utf-8")]
    barrier.wait()
    t0 = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes on one machine
    encodings = tok.encode_batch(docs, add_special_tokens=False)
    t1 = time.perf_counter()
    results.put((sum(len(e.ids) for e in encodings) + len(docs), t0, t1))  # + one EOS per document


def tokenizer_floor(tokenizer: Path, files: list[Path], workers: int) -> tuple[float, int]:
    """Tokens/s of bare ``encode_batch`` in ``workers`` concurrent single-threaded processes."""
    ctx = mp.get_context("spawn")  # fresh interpreters, so RAYON_NUM_THREADS takes effect
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_floor_process, args=(str(tokenizer), [str(f) for f in files[i::workers]],
                                                      barrier, results)) for i in range(workers)]
    for p in procs:
        p.start()
    out = [results.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"floor process failed with exit code {p.exitcode}")
    tokens = sum(n for n, _, _ in out)
    return tokens / (max(t1 for _, _, t1 in out) - min(t0 for _, t0, _ in out)), tokens


def run_pipeline(files: list[Path], tokenizer: Path, out: Path, workers: int, shard_tokens: int | None) -> int:
    """`marin_data.corpus.build.shard_subset` (what ``marin-data shard`` calls); returns the tokens written."""
    from marin_data.corpus.build import shard_subset

    extra = {} if shard_tokens is None else {"shard_tokens": shard_tokens}
    return shard_subset(files, subset="bench", tokenizer=str(tokenizer), out=out, workers=workers, **extra).tokens


def pipeline_rate(files: list[Path], tokenizer: Path, scratch: Path, workers: int,
                  shard_tokens: int | None = None) -> tuple[float, int]:
    out = scratch / f"corpus-w{workers}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    tokens = run_pipeline(files, tokenizer, out, workers, shard_tokens)
    rate = tokens / (time.perf_counter() - t0)
    shutil.rmtree(out, ignore_errors=True)
    return rate, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=24, help="MB of text to tokenize (1e6 bytes)")
    ap.add_argument("--vocab-size", type=int, default=32_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to measure")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--shard-tokens", type=int, default=None,
                    help="tokens per shard (default: the pipeline's 2^28, i.e. one shard at these sizes, packed "
                         "by one worker; a real run over many GB cuts many shards, packed in parallel)")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench_shard_", dir=args.dir))
    try:
        t0 = time.perf_counter()
        files = write_documents(scratch, args.mb)
        tokenizer = train_tokenizer(files, scratch, args.vocab_size)
        mb = sum(f.stat().st_size for f in files) / 1e6
        print(f"input: {len(files)} jsonl files, {mb:.1f} MB; byte-level BPE, vocab {args.vocab_size}; "
              f"prepared in {time.perf_counter() - t0:.1f}s; {len(os.sched_getaffinity(0))} cores available")
        floor: dict[int, list[float]] = {w: [] for w in args.workers}
        pipe: dict[int, list[float]] = {w: [] for w in args.workers}
        for rep in range(args.repeats):
            for w in args.workers:
                runs = {"floor": lambda: tokenizer_floor(tokenizer, files, w),
                        "pipeline": lambda: pipeline_rate(files, tokenizer, scratch, w, args.shard_tokens)}
                got = {k: runs[k]() for k in (("floor", "pipeline") if rep % 2 == 0 else ("pipeline", "floor"))}
                if got["pipeline"][1] != got["floor"][1]:
                    raise RuntimeError(f"pipeline wrote {got['pipeline'][1]} tokens, the floor encoded {got['floor'][1]}")
                floor[w].append(got["floor"][0])
                pipe[w].append(got["pipeline"][0])
        print(f"\nmedians of {args.repeats} repeats\n")
        print("| workers | floor M tokens/s | pipeline M tokens/s | pipeline / floor | per-repeat ratios |")
        print("|---:|---:|---:|---:|---|")
        for w in args.workers:
            ratios = [p / fl for p, fl in zip(pipe[w], floor[w])]  # side by side, within each repeat
            print(f"| {w} | {statistics.median(floor[w]) / 1e6:.3f} | {statistics.median(pipe[w]) / 1e6:.3f} | "
                  f"{statistics.median(ratios):.2f} | {', '.join(f'{r:.2f}' for r in ratios)} |")
        lo, hi = min(args.workers), max(args.workers)
        if lo != hi:
            scale = lambda d: statistics.median(d[hi]) / statistics.median(d[lo])  # noqa: E731
            print(f"\nscaling {lo} -> {hi} workers: floor {scale(floor):.2f}x, pipeline {scale(pipe):.2f}x "
                  f"(ideal {hi / lo:.0f}x; goal: pipeline >= 0.85 of floor, near-linear scaling)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
