"""``marin-data trace`` at Marin's scale: the hero run's shape (200 cells, mixture blocks of 49,152 sequences,
11,264 x 4,096-token steps, 390,251 steps, weights staged at steps 108,000 and 312,192, block shuffle 256 x 8)
on a simulated store of ledgers and offsets only.

The store is simulated because 200 cells of offsets (~23 billion documents) do not fit this machine: it holds
the ledgers and ``zarr.json`` files of 200 caches whose token counts add up to the store's 23.01T (log-normal
sizes, fixed seed) at ~1,100 tokens a document, and makes each offsets chunk file's bytes when a range of it
is read (its shard index, or one inner chunk). Those inner chunks are stored as blosc frames at clevel 0 (a
copy), so their exact sizes are known without compressing the ~200 GB, in blocks of 1 MiB as lz4 clevel 5
frames of int64 have, so a step decodes as many blocks as it would from a real cache. A real lz4 block costs
more to decode, so the run also times the decode of one block of a real lz4 clevel 5 offsets inner chunk
against one of a copy frame and reports the forward step's time without the simulation's own cost of making
bytes and with that difference added for every block it decoded (zstd clevel 1 frames, newer Levanter's, have
32 KiB blocks: cheaper). The weights are placeholders (Marin's are not public): proportional to cell size,
with a few cells below 1/49,152. The reference a step with documents is set against is bare blosc decoding
as many distinct whole inner chunks, each fresh from the store, as the trace reads.

    .venv/bin/python benchmarks/bench_trace.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import crc32c
import numpy as np
import yaml
from numcodecs import blosc

from marin_data.levanter.arraymeta import LZ4, ArrayMeta, render_array_meta
from marin_data.levanter.chunkfile import block_items, decode_block
from marin_data.levanter.ledger import Ledger, render_ledger
from marin_data.stores.base import ObjectInfo, ReadStream, Store

STORE_TOKENS = 23_010_000_000_000
DOC_TOKENS = 1_100
OFFSETS = ArrayMeta(dtype="int64", blosc=LZ4)
DATA = ArrayMeta(dtype="int64", blosc=LZ4)
FRAME = OFFSETS.inner * 8 + 16  # a blosc frame at clevel 0: the values and the 16-byte header
BLOCK = 2**20  # bytes per blosc block of an lz4 clevel 5 offsets inner chunk
CELLS = [f"cluster={c}/quality={q}" for c in range(40) for q in range(5)]


class SimStore(Store):
    """Ledgers, ``zarr.json`` files and offsets chunk files of 200 caches, made as they are read."""

    def __init__(self, rows: dict[str, int], seed: int = 0) -> None:
        self.url = "sim://marin-store"
        rng = np.random.default_rng(seed)
        self.pattern = np.cumsum(rng.integers(1, 2 * DOC_TOKENS, OFFSETS.inner)).astype(np.int64)
        self.shifted = np.concatenate([[0], self.pattern[:-1]])  # element lo + t of a frame: g*S + shifted[t]
        # every copy frame has the same 16-byte blosc header (same sizes): take it once, then append the values
        self.header = blosc.compress(self.shifted, b"lz4", 0, blosc.NOSHUFFLE, BLOCK)[:16]
        self.seconds = self.cpu = 0.0  # spent making bytes (wall, CPU): the simulation's own cost, reported apart
        self.rows = rows
        self.reads = self.bytes = 0

    def tokens(self, cell: str) -> int:
        rows = self.rows[cell]
        full, rest = divmod(rows, OFFSETS.inner)
        return int(full * self.pattern[-1] + (self.pattern[rest - 1] if rest else 0))

    def _file(self, path: str) -> tuple[str, str, int] | None:
        for cell in self.rows:
            if path.startswith(cell + "/"):
                rest = path[len(cell) + 1:]
                if rest.startswith("input_ids/offsets/c/"):
                    return cell, "chunk", int(rest.rsplit("/", 1)[1])
                return cell, rest, -1
        return None

    def _stored(self, cell: str, k: int) -> int:
        count = min(self.rows[cell] + 1 - k * OFFSETS.chunk, OFFSETS.chunk)
        return -(-count // OFFSETS.inner)

    def _bytes(self, cell: str, name: str, k: int) -> bytes | None:
        if name == "shard_ledger.json":
            rows = self.rows[cell]
            return render_ledger(Ledger(rows, {"sim": rows}, True, ["sim"], {"input_ids": self.tokens(cell)}))
        if name == "input_ids/offsets/zarr.json":
            return render_array_meta(OFFSETS)
        if name == "input_ids/data/zarr.json":
            return render_array_meta(DATA)
        return None

    def _index(self, cell: str, k: int) -> bytes:
        table = np.full((OFFSETS.inner_per_chunk, 2), 2**64 - 1, "<u8")
        n = self._stored(cell, k)
        table[:n, 0] = np.arange(n, dtype=np.uint64) * FRAME
        table[:n, 1] = FRAME
        raw = table.tobytes()
        return raw + struct.pack("<I", crc32c.crc32c(raw))

    def _frame(self, cell: str, k: int, i: int) -> bytes:
        lo = k * OFFSETS.chunk + i * OFFSETS.inner  # row r = e - 1 ends at (r // inner) * S + pattern[r % inner]
        values = self.shifted + (lo // OFFSETS.inner) * self.pattern[-1]
        if lo == 0:
            values[0] = self.rows[cell]
        past = self.rows[cell] + 1 - lo
        if past < OFFSETS.inner:
            values[max(past, 0):] = 0
        return self.header + values.tobytes()

    def head(self, path: str) -> ObjectInfo | None:
        found = self._file(path)
        if found is None:
            return None
        cell, name, k = found
        if name == "chunk":
            return ObjectInfo(path, self._stored(cell, k) * FRAME + OFFSETS.index_bytes)
        data = self._bytes(cell, name, k)
        return None if data is None else ObjectInfo(path, len(data))

    def read(self, path: str, start: int = 0, end: int | None = None) -> ReadStream:
        t0, c0 = time.perf_counter(), time.process_time()
        cell, name, k = self._file(path)
        if name != "chunk":
            data = self._bytes(cell, name, k)[start:end]
        else:
            body = self._stored(cell, k) * FRAME
            if start >= body:
                data = self._index(cell, k)[start - body:None if end is None else end - body]
            else:
                i, skip = divmod(start, FRAME)
                data = self._frame(cell, k, i)[skip:skip + (end - start)]
        self.reads += 1
        self.bytes += len(data)
        self.seconds += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        return ReadStream(iter([data]), start=start, close=lambda: None, stop=end)

    def list(self, prefix: str = ""):
        raise NotImplementedError("a trace never lists the store")

    def put(self, path, src, *, sha256, size):
        raise NotImplementedError


def hero_yaml(path: Path, rows: dict[str, int]) -> None:
    rng = np.random.default_rng(1)
    names = {cell: "c{}q{}".format(*(p.split("=")[1] for p in cell.split("/"))) for cell in CELLS}
    sizes = np.array([rows[c] for c in CELLS], dtype=float)
    stages, starved = [], rng.choice(len(CELLS), 8, replace=False)
    for step in (0, 108_000, 312_192):
        w = sizes * rng.uniform(0.5, 1.5, len(CELLS))
        w[starved] = 1e-6 * w.sum()  # below 1/49,152 in every stage: never served
        stages.append([step, {names[c]: float(x / w.sum()) for c, x in zip(CELLS, w)}])
    config = {"data": {"tokenizer": "meta-llama/Meta-Llama-3.1-8B",
                       "components": {names[c]: {"type": "cached", "flat_cache": True, "cache_dir":
                                                 f"s3://marin-us-east-02a/marin/datakit/store_4d2e363d/{c}"}
                                      for c in CELLS},
                       "train_weights": stages, "mixture_block_size": 49_152, "stop_strategy": "restart",
                       "shuffle": {"io_block_size": 256, "window_blocks": 8, "perm_type": "feistel"},
                       "permutation_type": "feistel"},
              "trainer": {"seed": 0, "train_batch_size": 11_264, "num_train_steps": 390_251},
              "model": {"max_seq_len": 4_096}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def cell_rows() -> dict[str, int]:
    rng = np.random.default_rng(0)
    sizes = rng.lognormal(0, 0.6, len(CELLS))
    tokens = sizes / sizes.sum() * STORE_TOKENS
    return {c: int(t // DOC_TOKENS) for c, t in zip(CELLS, tokens)}


def whole_decodes(store: SimStore, n: int) -> float:
    """Seconds to decode ``n`` distinct offsets inner chunks whole, bare blosc, each frame fresh from the store
    as a trace's are (the making not timed): what a step's documents would cost in decoding alone, were each
    inner chunk it reads decoded whole rather than only the blocks its lookups need."""
    out = np.empty(OFFSETS.inner, "<i8")
    seconds = 0.0
    for i in range(n):
        frame = store._frame(CELLS[i % len(CELLS)], 0, i % 64)
        t0 = time.perf_counter()
        blosc.decompress(frame, out)
        seconds += time.perf_counter() - t0
    return seconds


def decode_gap_ms() -> float:
    """ms more to decode a block of a real lz4 clevel 5 offsets inner chunk than one of the store's copy frames
    (median of 20)."""
    values = np.cumsum(np.random.default_rng(2).integers(1, 2 * DOC_TOKENS, OFFSETS.inner)).astype("<i8")
    frames = [blosc.compress(values, b"lz4", 5, blosc.SHUFFLE, 0),
              blosc.compress(values, b"lz4", 0, blosc.NOSHUFFLE, BLOCK)]
    if {block_items(f, OFFSETS, "gap") for f in frames} != {BLOCK // 8}:
        raise SystemExit("this blosc does not write lz4 clevel 5 offsets in blocks of 1 MiB: fix BLOCK")
    gaps = []
    for _ in range(20):
        times = []
        for frame in frames:
            t0 = time.perf_counter()
            decode_block(frame, OFFSETS, 1, BLOCK // 8, "gap")
            times.append(time.perf_counter() - t0)
        gaps.append((times[0] - times[1]) * 1e3)
    return statistics.median(gaps)


def main() -> None:
    from marin_data.levanter.order.trace import open_trace

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, nargs="+", default=[0, 108_000, 250_000, 390_250])
    args = ap.parse_args()
    rows = cell_rows()
    gap = decode_gap_ms()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "hero.yaml"
        hero_yaml(config, rows)
        for _ in range(args.repeats):
            store = SimStore(rows)
            t0 = time.perf_counter()
            trace = open_trace(str(config), store=store)
            results.setdefault("open (200 ledgers)", []).append(time.perf_counter() - t0)
            for step in args.steps:
                t0 = time.perf_counter()
                trace.step(step, documents=False)
                results.setdefault("step, no documents", []).append(time.perf_counter() - t0)
                reads0, bytes0, made0, cpu0 = store.reads, store.bytes, store.seconds, store.cpu
                inner0 = sum(c.inner_reads for c in trace.caches.values())
                blocks0 = sum(c.block_reads for c in trace.caches.values())
                t0, c0 = time.perf_counter(), time.process_time()
                out = trace.step(step)
                results.setdefault("step with documents", []).append(time.perf_counter() - t0)
                results.setdefault("of which the simulated store", []).append(store.seconds - made0)
                results.setdefault("step with documents, CPU seconds without the store's", []).append(
                    time.process_time() - c0 - (store.cpu - cpu0))
                inner = sum(c.inner_reads for c in trace.caches.values()) - inner0
                results.setdefault("inner chunks read per step", []).append(inner)
                results.setdefault("blocks decoded per step", []).append(
                    sum(c.block_reads for c in trace.caches.values()) - blocks0)
                results.setdefault("step with documents, lz4 frames (estimated)", []).append(
                    results["step with documents"][-1] - results["of which the simulated store"][-1]
                    + results["blocks decoded per step"][-1] * gap / 1e3)
                whole = whole_decodes(store, inner)
                results.setdefault("whole decodes of those inner chunks", []).append(whole)
                results.setdefault("ratio to whole decodes", []).append(
                    (results["step with documents"][-1] - results["of which the simulated store"][-1]) / whole)
                results.setdefault("MB read per step", []).append((store.bytes - bytes0) / 1e6)
                slot = out["batch"][len(out["batch"]) // 2]
                doc = f"{slot['component']}:{slot['documents'][0]['row']}"
                t0 = time.perf_counter()
                back = trace.document(doc)
                results.setdefault("document over the whole run", []).append(time.perf_counter() - t0)
                assert step in back["steps"]
            t0 = time.perf_counter()
            summary = trace.summary()
            results.setdefault("summary to the end", []).append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in results.items()}
    med["peak RSS (MB)"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    med["never served"] = len(summary["never_served"])
    json.dump(med, sys.stdout, indent=1)
    print("\nspread (min, max):")
    json.dump({k: [min(v), max(v)] for k, v in results.items()}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
