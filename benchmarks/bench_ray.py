"""`marin-data shard` on the local process pool vs on Ray tasks, same cores, side by side.

Both engines run the same pipeline (`marin_data.corpus.build.shard_subset`) over the same inputs as
`bench_shard.py` (the standard library's source cut into ~4 KB documents, a byte-level BPE trained on
them), with ``--workers`` workers each: the local engine a spawned process pool, the Ray engine a private
local Ray instance with that many CPUs. Each engine is started once and warmed by one untimed run (worker
imports, page cache), then each repeat times one run on each, back to back, and the ratio is taken within
the repeat; the figures are medians. Start-up (a fresh pool; ``ray.init``) is timed separately: a CLI run
pays it once, a long run on a cluster amortises it. Every run must produce the same manifest sha256, so
the benchmark also checks that the engines wrote identical corpora.

    .venv/bin/python benchmarks/bench_ray.py --mb 24 --repeats 3          # the record
    .venv/bin/python benchmarks/bench_ray.py --mb 2 --repeats 1           # quick check
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_shard import train_tokenizer, write_documents

from marin_data.corpus.build import shard_subset
from marin_data.engines.local import LocalEngine
from marin_data.engines.ray import RayEngine


def timed_run(files: list[Path], tokenizer: Path, out: Path, engine) -> tuple[float, int, str]:
    """Seconds, tokens written and manifest sha256 of one `shard_subset` run into a fresh ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    report = shard_subset(files, subset="bench", tokenizer=str(tokenizer), out=out, engine=engine)
    seconds = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return seconds, report.tokens, report.manifest_sha256


def started(engine) -> float:
    """Start an engine's workers (one trivial job per worker); return the seconds it took."""
    t0 = time.perf_counter()
    list(engine.map_unordered(abs, [-1] * engine.workers))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=24, help="MB of text to tokenize (1e6 bytes)")
    ap.add_argument("--vocab-size", type=int, default=32_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="cores per engine (all)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="bench_ray_", dir=args.dir))
    engines = {"local": LocalEngine(args.workers), "ray": RayEngine(args.workers)}
    try:
        files = write_documents(scratch, args.mb)
        tokenizer = train_tokenizer(files, scratch, args.vocab_size)
        mb = sum(f.stat().st_size for f in files) / 1e6
        startup = {name: started(engine) for name, engine in engines.items()}
        digests = set()
        for name, engine in engines.items():  # warm-up: worker imports, tokenizer load, page cache
            digests.add(timed_run(files, tokenizer, scratch / name / "corpus", engine)[2])
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.repeats):
            for name, engine in engines.items():
                seconds, tokens, digest = timed_run(files, tokenizer, scratch / name / "corpus", engine)
                rates[name].append(tokens / seconds)
                digests.add(digest)
        if len(digests) != 1:
            raise RuntimeError(f"the engines wrote different corpora: manifest sha256s {sorted(digests)}")
        ratios = [r / lo for r, lo in zip(rates["ray"], rates["local"])]
        print(f"input: {len(files)} jsonl files, {mb:.1f} MB, {tokens:,} tokens; byte-level BPE, vocab "
              f"{args.vocab_size}; {args.workers} workers per engine, {len(os.sched_getaffinity(0))} cores available; "
              f"identical output (manifest sha256 {digests.pop()[:12]}…)\n")
        print(f"| engine ({args.workers} workers) | M tokens/s (median of {args.repeats}) | vs local | start-up s |")
        print("|---|---:|---:|---:|")
        print(f"| local process pool | {statistics.median(rates['local']) / 1e6:.3f} | 1.00 | {startup['local']:.1f} |")
        print(f"| Ray tasks, local instance | {statistics.median(rates['ray']) / 1e6:.3f} | "
              f"{statistics.median(ratios):.2f} | {startup['ray']:.1f} |")
        print(f"\nray/local per repeat: {', '.join(f'{r:.2f}' for r in ratios)} (start-up excluded; goal >= 0.9)")
    finally:
        for engine in engines.values():
            engine.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
