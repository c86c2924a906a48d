"""`marin-data convert` both ways against the Zarr libraries' own read and write of the same tokens.

One Levanter cache (random ids below a Llama-3 vocabulary, log-normal document lengths, Levanter's grid:
one chunk file) is written with `marin_data.levanter.write_cache` in both codec generations, int32 + blosc
lz4 clevel 5 and int64 + blosc zstd clevel 1. Each repeat, in rotated order, from the page cache:

- ``to marin``: `convert_to_marin` of the cache into a fresh corpus (structural checks, decode, Parquet
  shards, commit), against ``zarr-python read`` of its two arrays (offsets and tokens) into memory;
- ``to levanter``: `convert_to_levanter` of that corpus into a fresh store (shards hashed and decoded, a
  cache written), against ``zarr-python write`` of the same two arrays (same sharding and codec) from memory.

Two more rows say where convert's time goes: ``parquet write``, the corpus's shard writer (`write_shard`)
writing the same documents from memory (the floor of ``to marin``), and ``parquet read``, pyarrow reading
the tokens of the corpus's shards (what ``to levanter`` decodes).

tensorstore (Levanter's own library) is not a dependency: ``--tensorstore-python`` names a Python that has it
(the throwaway venv of scripts/make_levanter_fixtures.py), which then reads and writes the same arrays in its
own process, timing only its read or write. Figures: tokens/s, medians of the repeats with the range, and
the ratio of convert to each library within every repeat (median and range).

    .venv/bin/python benchmarks/bench_convert.py --tokens 16000000 --repeats 5 \\
        --tensorstore-python /tmp/levanter-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_CODECS = {"lz4": ("lz4", 5), "zstd": ("zstd", 1)}


def _blosc(codec: str, itemsize: int) -> dict:
    cname, clevel = _CODECS[codec]
    return {"name": "blosc", "configuration": {"cname": cname, "clevel": clevel, "shuffle": "shuffle",
                                               "typesize": itemsize, "blocksize": 0}}


def tensorstore_run(what: str, root: str, dtype: str, codec: str) -> float:
    """In the tensorstore venv: read the cache at ``root`` (``what="read"``), or write the arrays saved in
    ``root/*.npy`` as a cache's two arrays (``"write"``); the seconds it took."""
    import tensorstore as ts

    arrays = {"offsets": np.load(f"{root}/offsets.npy"), "data": np.load(f"{root}/data.npy")} \
        if what == "write" else {}
    t0 = time.perf_counter()
    for name in ("offsets", "data"):
        kv = {"driver": "file", "path": f"{root}/input_ids/{name}"}
        if what == "read":
            array = ts.open({"driver": "zarr3", "kvstore": kv}, open=True).result()
            n = int(array[0:1].read().result()[0]) + 1 if name == "offsets" else int(offsets[-1])
            values = array[0:n].read().result()
            if name == "offsets":
                offsets = values
        else:
            values = arrays[name]
            itemsize = values.dtype.itemsize
            spec = {"driver": "zarr3", "kvstore": kv, "create": True, "delete_existing": True,
                    "metadata": {"shape": [len(values)], "data_type": str(values.dtype),
                                 "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [134_217_728]}},
                                 "codecs": [{"name": "sharding_indexed", "configuration": {
                                     "chunk_shape": [262_144],
                                     "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                                _blosc(codec, itemsize)],
                                     "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                                      {"name": "crc32c"}]}}]}}
            ts.open(spec).result().write(values).result()
    return time.perf_counter() - t0


def zarr_values(root: Path) -> np.ndarray:
    """A cache's tokens as zarr-python reads its two arrays (the offsets say how many)."""
    import zarr

    offsets = zarr.open_array(str(root / "input_ids/offsets"), mode="r")
    ends = offsets[0:int(offsets[0]) + 1]
    return zarr.open_array(str(root / "input_ids/data"), mode="r")[0:int(ends[-1])]


def zarr_write(root: Path, data: np.ndarray, offsets: np.ndarray, codec: str) -> None:
    import zarr
    from zarr.codecs import BloscCodec

    cname, clevel = _CODECS[codec]
    for name, values in (("offsets", offsets), ("data", data)):
        array = zarr.create_array(str(root / "input_ids" / name), shape=values.shape, dtype=values.dtype,
                                  chunks=(262_144,), shards=(134_217_728,), overwrite=True,
                                  compressors=BloscCodec(cname=cname, clevel=clevel, shuffle="shuffle"))
        array[:] = values


def build(root: Path, tokens: int, dtype: str, codec: str) -> tuple[np.ndarray, np.ndarray]:
    """The cache, and its two arrays as a library writes them (offsets[0] is the row count, as Levanter has it)."""
    from marin_data.levanter import LZ4, ZSTD, write_cache

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(6.5, 1.0, tokens // 500), 1, 100_000).astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= tokens]
    data = rng.integers(0, 128_256, int(lengths.sum())).astype(dtype)
    write_cache(root, np.split(data, np.cumsum(lengths)[:-1]), dtype=dtype, codec=LZ4 if codec == "lz4" else ZSTD)
    offsets = np.concatenate([[len(lengths)], np.cumsum(lengths)]).astype(np.int64)
    return data, offsets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tensorstore-python", default=None)
    ap.add_argument("--only-tensorstore", nargs=4, metavar=("WHAT", "ROOT", "DTYPE", "CODEC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only_tensorstore:
        print(tensorstore_run(*args.only_tensorstore))
        return
    from tokenizers import Tokenizer, models

    from marin_data.corpus.shard import write_shard
    from marin_data.levanter import LZ4, ZSTD
    from marin_data.levanter.to_levanter import convert_to_levanter
    from marin_data.levanter.to_marin import convert_to_marin
    from marin_data.fileio.parquet_io import open_parquet
    from marin_data.raw.tokenizer import TokenizerInfo

    out: dict = {"cores": len(os.sched_getaffinity(0)), "machine": platform.processor() or platform.machine(),
                 "python": platform.python_version(),
                 "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True).stdout.strip()}
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as tmp:
        tmp = Path(tmp)
        words = {"<|end_of_text|>": 0, **{f"t{i}": i for i in range(1, 128_256)}}
        tokenizer = Tokenizer(models.WordLevel(words, unk_token="t1"))
        tokenizer.add_special_tokens(["<|end_of_text|>"])
        (tmp / "tok").mkdir()
        tokenizer.save(str(tmp / "tok/tokenizer.json"))
        for dtype, codec in (("int32", "lz4"), ("int64", "zstd")):
            cache = tmp / f"cache-{dtype}"
            data, offsets = build(cache, args.tokens, dtype, codec)
            n = len(data)
            np.save(tmp / "data.npy", data)
            np.save(tmp / "offsets.npy", offsets)

            def to_marin() -> None:
                shutil.rmtree(tmp / "corpus", ignore_errors=True)
                convert_to_marin(cache, dest=tmp / "corpus", tokenizer=str(tmp / "tok/tokenizer.json"))

            def to_levanter() -> None:
                shutil.rmtree(tmp / "caches", ignore_errors=True)
                convert_to_levanter(tmp / "corpus", dest=tmp / "caches", dtype=dtype,
                                    codec=LZ4 if codec == "lz4" else ZSTD)

            def written() -> None:
                zarr_write(tmp / "zarr", data, offsets, codec)

            def tensorstore(what: str, root: Path):
                return lambda: float(subprocess.run(
                    [args.tensorstore_python, __file__, "--only-tensorstore", what, str(root), dtype, codec],
                    capture_output=True, text=True, check=True).stdout)

            ids = [f"{cache.name}:{row}" for row in range(len(offsets) - 1)]
            info = TokenizerInfo(name="wide", sha256="0" * 64, vocab_size=128_256, eos_id=0)

            def parquet_write() -> None:
                write_shard(tmp / "floor.parquet", ids, data.astype(np.uint32),
                            np.concatenate([[0], offsets[1:]]), info)

            def parquet_read() -> None:
                for shard in sorted((tmp / "corpus/data").rglob("*.parquet")):
                    with open_parquet(shard) as pf:
                        pf.read(columns=["tokens"])

            runs = {"to marin": to_marin, "zarr-python read": lambda: zarr_values(cache),
                    "parquet write": parquet_write, "to levanter": to_levanter, "zarr-python write": written,
                    "parquet read": parquet_read}
            if args.tensorstore_python:
                runs |= {"tensorstore read": tensorstore("read", cache), "tensorstore write": tensorstore("write", tmp)}
            to_marin()  # the corpus `to levanter` reads
            times: dict[str, list[float]] = {r: [] for r in runs}
            names = list(runs)
            for rep in range(args.repeats + 1):  # the first round warms the page cache and is dropped
                order = names[rep % len(names):] + names[:rep % len(names)]
                for r in order:
                    t0 = time.perf_counter()
                    own = runs[r]()
                    seconds = own if isinstance(own, float) else time.perf_counter() - t0
                    if rep:
                        times[r].append(seconds)
            for written_root in (tmp / "caches" / cache.name, tmp / "zarr"):  # what each wrote holds the tokens
                assert np.array_equal(zarr_values(written_root), data), written_root
            row = {r: {"Mtokens_per_s_median": round(n / statistics.median(t) / 1e6, 1),
                       "range_Mtokens_per_s": [round(n / max(t) / 1e6, 1), round(n / min(t) / 1e6, 1)]}
                   for r, t in times.items()}
            for ours, lib in (("to marin", "zarr-python read"), ("to levanter", "zarr-python write"),
                              ("to marin", "tensorstore read"), ("to levanter", "tensorstore write"),
                              ("to marin", "parquet write"), ("to levanter", "parquet read")):
                if lib in times:
                    ratio = [b / a for a, b in zip(times[ours], times[lib])]  # convert's speed over the library's
                    row[f"{ours} / {lib}"] = {"median": round(statistics.median(ratio), 2),
                                              "range": [round(min(ratio), 2), round(max(ratio), 2)]}
            out[f"{dtype}/{codec}"] = {"tokens": n, "documents": len(offsets) - 1, **row}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
