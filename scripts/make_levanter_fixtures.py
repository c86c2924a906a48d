"""Make the golden Levanter token caches in ``tests/fixtures/levanter/`` with real Levanter, and their EXPECTED.json.

The caches are written by Levanter's own writers (``SerialCacheWriter``, ``build_or_load_cache``,
``write_levanter_cache`` + ``consolidate_shard_cache_ledgers``) and read back with ``TreeCache.load``; nothing
here imports marin. The test suite never installs Levanter: it checks these files with pyarrow and numpy only.

Recreate the throwaway venv (Python 3.11, CPU only, about 1.8 GB and 5 minutes), then run from the repository root:

    python3.11 -m venv /tmp/levanter-venv
    /tmp/levanter-venv/bin/pip install marin-levanter==0.2.20.dev202606180959 gitpython
    JAX_PLATFORMS=cpu /tmp/levanter-venv/bin/python scripts/make_levanter_fixtures.py           # rewrite the fixtures
    JAX_PLATFORMS=cpu /tmp/levanter-venv/bin/python scripts/make_levanter_fixtures.py --check   # rebuild, compare bytes

That Levanter writes blosc lz4 clevel 5 (it names only ``clevel``; tensorstore fills in lz4 and shuffle). Newer
Levanter (0.2.227, Python >= 3.12) writes blosc zstd clevel 1, which 0.2.20 refuses to open; the zstd fixtures
(``consolidated-int64-zstd``, ``store/cluster=1/quality=4``) are written by the same 0.2.20 writers with that newer
zarr spec patched into ``levanter.store.jagged_array._get_spec``, and EXPECTED.json says so (``made_by``). Under
newer Levanter only ``--check`` runs: it writes those two with that Levanter's own default and compares bytes
(``pip install marin-levanter==0.2.227.dev40316220070`` into a Python 3.12 venv). ``--check`` exits 1 when a
rebuild differs from the committed bytes in any file.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from importlib.metadata import version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "tests" / "fixtures" / "levanter"
LEVANTER_PIN = "0.2.20.dev202606180959"
INNER_CHUNK = 262_144  # elements per inner chunk, levanter.store.jagged_array.DEFAULT_CHUNK_SIZE
TOKENIZER_DIR = "levanter-fixture-wordlevel"
# Newer Levanter's DEFAULT_BLOSC_CODEC = BloscCodec("zstd", 1), as levanter/store/jagged_array.py of 0.2.227 has it.
NEWER_BLOSC = {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 1}}
MADE_BY_LEVANTER = f"levanter {LEVANTER_PIN}"
MADE_BY_PATCHED = (f"levanter {LEVANTER_PIN} writers with the zarr spec of levanter 0.2.227 "
                   "(blosc zstd clevel 1) patched into levanter.store.jagged_array._get_spec")
WORDS = ("the a of and to in is was for on that with as by it at from this be are or an which not data token "
         "cache model text word line file read write").split()
TEXTS = ["the data of the model is in the cache", "", "a token", "it was the word for this and that line",
         "unknown words map to unk", "read the file " * 12]


def rng_tokens(rng: np.random.Generator, lengths: list[int], dtype: str) -> list[np.ndarray]:
    """Token ids below a Llama-3 vocabulary (128,256), so they need more than 16 bits."""
    return [rng.integers(0, 128_256, size=n).astype(dtype) for n in lengths]


def ramp(n: int, dtype: str) -> np.ndarray:
    """A long document that both codecs compress well (zstd clevel 1 barely compresses a period of 5,000 tokens):
    token j is 1000 + j // 1024."""
    return (1000 + np.arange(n) // 1024).astype(dtype)


@contextmanager
def newer_codec():
    """Levanter 0.2.20's own writers, with newer Levanter's blosc zstd clevel 1 in the zarr spec they create."""
    import levanter.store.jagged_array as ja

    if hasattr(ja, "DEFAULT_BLOSC_CODEC"):  # newer Levanter: zstd clevel 1 is already what it writes
        yield
        return
    original = ja._get_spec

    def spec(path, shape):
        out = original(path, shape)
        if "metadata" in out:  # only the zarr3 (file) spec carries codecs
            out["metadata"]["codecs"][0]["configuration"]["codecs"] = [NEWER_BLOSC]
        return out

    ja._get_spec = spec
    try:
        yield
    finally:
        ja._get_spec = original


def serial_cache(path: str, batches: list[list[np.ndarray]], dtype: str) -> None:
    from levanter.store.cache import SerialCacheWriter

    with SerialCacheWriter(path, {"input_ids": np.zeros(0, dtype=dtype)}) as writer:
        for batch in batches:  # one write_batch per batch: the offsets of the second continue the first's
            writer.write_batch([{"input_ids": doc} for doc in batch])


def sharded_cache(path: str, parts: list[list[np.ndarray]], dtype: str) -> None:
    """As Marin's tokenizer writes a split: zephyr's write_levanter_cache(metadata={}) per part, then one ledger."""
    from levanter.store.cache import consolidate_shard_cache_ledgers, write_levanter_cache

    paths = []
    for i, docs in enumerate(parts):
        part = f"{path}/part-{i:05d}-of-{len(parts):05d}"
        write_levanter_cache(iter([{"input_ids": d} for d in docs]), part, metadata={})
        paths.append(part)
    consolidate_shard_cache_ledgers(paths, path, {"input_ids": np.zeros(0, dtype=dtype)})


def write_stats(path: str) -> None:
    """Marin's write_stats_json: ``.stats.json`` inside the split's cache directory, json.dump's default format."""
    ledger = json.loads(Path(path, "shard_ledger.json").read_text())
    stats = {"total_tokens": ledger["field_counts"].get("input_ids", 0), "total_elements": ledger["total_num_rows"]}
    with open(Path(path, ".stats.json"), "w") as f:
        json.dump(stats, f)


def tokenizer_files() -> None:
    """A WordLevel tokenizer small enough to commit, with BOS and EOS as BatchTokenizer expects."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {w: i + 3 for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    os.makedirs(TOKENIZER_DIR)
    tok.save(f"{TOKENIZER_DIR}/tokenizer.json")
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    Path(TOKENIZER_DIR, "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def tokenized_cache(path: str) -> None:
    """The path Levanter's own tokenize runs take: build_or_load_cache over a jsonl source with BatchTokenizer."""
    from levanter.data.sharded_datasource import datasource_from_jsonl
    from levanter.data.text._batch_tokenizer import BatchTokenizer
    from levanter.store.cache import build_or_load_cache
    from levanter.tokenizers import load_tokenizer

    with open("source.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in TEXTS)
    build_or_load_cache(path, datasource_from_jsonl(["source.jsonl"]), BatchTokenizer(load_tokenizer(TOKENIZER_DIR)))


SHARDED_WRITER = "write_levanter_cache per part + consolidate_shard_cache_ledgers"


def consolidated_int32_lz4(rng: np.random.Generator) -> dict:
    head = rng_tokens(rng, [0, 1, 2, 3, 17, 0, 64, 128, 5], "int32")
    start = sum(map(len, head))  # the long document starts here and ends 100 tokens into inner chunk 1
    tail = rng_tokens(rng, [1, 33, 7], "int32")
    serial_cache("consolidated-int32-lz4", [head, [ramp(INNER_CHUNK - start + 100, "int32"), *tail]], "int32")
    return {"writer": "SerialCacheWriter (two write_batch)", "long": {9: "ramp"}}


def tokenized_int64_lz4(rng: np.random.Generator) -> dict:
    tokenizer_files()
    tokenized_cache("tokenized-int64-lz4")
    os.remove("source.jsonl")
    return {"writer": f"build_or_load_cache + BatchTokenizer({TOKENIZER_DIR})", "texts": TEXTS}


def sharded_int32_lz4(rng: np.random.Generator) -> dict:
    sharded_cache("sharded-int32-lz4",
                  [rng_tokens(rng, [3, 0, 12, 1], "int32"), rng_tokens(rng, [40, 2, 9], "int32")], "int32")
    return {"writer": SHARDED_WRITER}


def consolidated_int64_zstd(rng: np.random.Generator) -> dict:
    """With a run of zeros long enough that inner chunk 2 equals the fill value: tensorstore does not store such
    a chunk, so the shard index marks it missing and a read returns zeros."""
    head = rng_tokens(rng, [4, 0, 9, 1, 20], "int64")
    start = sum(map(len, head))
    long_doc = ramp(INNER_CHUNK - start + 100, "int64")
    zeros = np.zeros(2 * INNER_CHUNK - 130 + 50, dtype="int64")  # from 130 tokens into chunk 1 to 50 into chunk 3
    serial_cache("consolidated-int64-zstd",
                 [head, [long_doc, *rng_tokens(rng, [30], "int64"), zeros, *rng_tokens(rng, [6], "int64")]], "int64")
    return {"writer": "SerialCacheWriter (two write_batch)", "long": {5: "ramp", 7: "zeros"}}


def store_cell(name: str, lengths: list[int]):
    """A cell of a store: a sharded cache of one part, with Marin's .stats.json."""
    def make_cell(rng: np.random.Generator) -> dict:
        sharded_cache(name, [rng_tokens(rng, lengths, "int32")], "int32")
        write_stats(name)
        return {"writer": SHARDED_WRITER + ", then Marin's write_stats_json"}
    return make_cell


# name -> (written with newer Levanter's zstd spec, builder). A store of two cells, one per codec generation.
FIXTURES = {"consolidated-int32-lz4": (False, consolidated_int32_lz4),
            "tokenized-int64-lz4": (False, tokenized_int64_lz4),
            "sharded-int32-lz4": (False, sharded_int32_lz4),
            "consolidated-int64-zstd": (True, consolidated_int64_zstd),
            "store/cluster=0/quality=0": (False, store_cell("store/cluster=0/quality=0", [5, 1, 0, 30, 2])),
            "store/cluster=1/quality=4": (True, store_cell("store/cluster=1/quality=4", [8, 8, 3]))}


def build(out: Path, names: list[str]) -> dict[str, dict]:
    """Write the fixtures ``names`` under ``out`` (the current directory while it runs): name -> how it was made.

    Each has its own seed, so building only some of them gives the same bytes."""
    os.chdir(out)
    os.environ["MARIN_PREFIX"] = str(out / "_marin")  # zephyr's scratch space, deleted below
    made = {}
    for name in names:
        newer, builder = FIXTURES[name]
        rng = np.random.default_rng(list(name.encode()))
        with newer_codec() if newer else nullcontext():
            made[name] = {"made_by": MADE_BY_PATCHED if newer else MADE_BY_LEVANTER} | builder(rng)
    shutil.rmtree(out / "_marin", ignore_errors=True)
    return made


def crc32c(data: bytes) -> int:
    import google_crc32c  # a dependency of the venv (google-cloud-storage); the test has its own

    return int.from_bytes(google_crc32c.Checksum(data).digest(), "big")


def shard_index(path: Path) -> dict:
    """Parse a chunk file's shard index (the last 512 x 16 + 4 bytes): this script's reading, not Levanter's."""
    raw = path.read_bytes()
    n_inner = 134_217_728 // INNER_CHUNK
    index = raw[-(n_inner * 16 + 4):]
    entries = np.frombuffer(index[:-4], dtype="<u8").reshape(n_inner, 2)
    stored = int.from_bytes(index[-4:], "little")
    if crc32c(index[:-4]) != stored:
        raise SystemExit(f"{path}: shard index crc32c {stored:#010x} does not match its 8192 bytes")
    present = [[i, int(o), int(n)] for i, (o, n) in enumerate(entries) if not (o == n == 2**64 - 1)]
    return {"bytes": len(raw), "index_crc32c": f"{stored:08x}", "inner_chunks": present}


def describe_arrays(cache: Path) -> dict:
    arrays = {}
    for name in ("offsets", "data"):
        meta = json.loads((cache / "input_ids" / name / "zarr.json").read_text())
        chunks = sorted(p for p in (cache / "input_ids" / name).rglob("*") if p.is_file() and p.name != "zarr.json")
        inner = meta["codecs"][0]["configuration"]["codecs"]
        arrays[name] = {"data_type": meta["data_type"], "fill_value": meta["fill_value"],
                        "blosc": next(c["configuration"] for c in inner if c["name"] == "blosc"),
                        "chunk_files": {p.relative_to(cache / "input_ids" / name).as_posix(): shard_index(p)
                                        for p in chunks}}
    return arrays


def as_expected(doc: np.ndarray, how: str | None) -> list[int] | dict:
    """Short documents verbatim; a long one by the rule that made it, its length and sha256 (test recomputes it)."""
    if how is None:
        return doc.tolist()
    return {"length": len(doc), "rule": "1000 + j // 1024" if how == "ramp" else "0",
            "sha256_int64le": hashlib.sha256(doc.astype("<i8").tobytes()).hexdigest(),
            "head": doc[:8].tolist(), "tail": doc[-8:].tolist()}


def read_back(path: str, how: dict) -> dict:
    """Every row as real Levanter returns it, plus the raw offsets and the ledgers beside them."""
    from levanter.store.cache import TreeCache

    ledger = json.loads(Path(path, "shard_ledger.json").read_text())
    cache = TreeCache.load(path, {"input_ids": np.zeros(0, dtype=np.int32)})
    rows = [row["input_ids"] for row in cache.get_batch_sync(list(range(len(cache))))]
    dtypes = sorted({str(r.dtype) for r in rows})
    entry = {"layout": ledger["layout"], "dtype": dtypes[0] if len(dtypes) == 1 else dtypes, "ledger": ledger,
             "rows": len(cache), "tokens": int(sum(len(r) for r in rows)),
             "flat_field_length": int(cache.flat_field_length("input_ids")),
             "documents": [as_expected(r, how.get(i)) for i, r in enumerate(rows)]}
    # A sharded cache's parts, and any cache left inside a consolidated one (build_or_load_cache leaves its
    # per-source shard caches there, each with a ledger and .success).
    nested = sorted(d.name for d in Path(path).iterdir() if (d / "shard_ledger.json").is_file())
    entry["caches"] = {}
    for key in (["."] if ledger["layout"] == "consolidated" else []) + nested:
        sub = os.path.normpath(f"{path}/{key}")
        part = TreeCache.load(sub, {"input_ids": np.zeros(0, dtype=np.int32)})
        offsets = part.store.tree["input_ids"].offsets[0:len(part) + 1].read().result()
        entry["caches"][key] = describe_arrays(Path(sub)) | {"offsets_read": offsets.tolist()}
        if key != ".":
            success = Path(sub, ".success")
            entry["caches"][key] |= {"ledger": json.loads(Path(sub, "shard_ledger.json").read_text()),
                                     ".success": success.read_text() if success.exists() else None,
                                     "rows": len(part)}
    stats = Path(path, ".stats.json")
    if stats.exists():
        entry[".stats.json"] = json.loads(stats.read_text())
    return entry


def expected(out: Path, made: dict[str, dict]) -> dict:
    os.chdir(out)
    caches = {}
    for name, how in made.items():
        long = how.pop("long", {})
        # Levanter 0.2.20 opens an array against its own spec (chunk grid, inner chunks, blosc clevel 5), so
        # tensorstore refuses zstd clevel 1 ('Incompatible "clevel": 1 vs 5'); under the newer spec it opens.
        with newer_codec() if how["made_by"] == MADE_BY_PATCHED else nullcontext():
            caches[name] = how | read_back(name, long)
    files = {p.relative_to(out).as_posix(): {"bytes": p.stat().st_size,
                                             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(out.rglob("*")) if p.is_file()}
    return {"made_with": {"marin-levanter": version("marin-levanter"), "tensorstore": version("tensorstore"),
                          "numpy": version("numpy"), "tokenizers": version("tokenizers"),
                          "python": platform.python_version(), "script": "scripts/make_levanter_fixtures.py"},
            "inner_chunk_elements": INNER_CHUNK, "caches": caches, "stores": {"store": ["cluster=0/quality=0",
                                                                                         "cluster=1/quality=4"]},
            "files": files}


def make(out: Path) -> None:
    made = build(out, list(FIXTURES))
    doc = expected(out, made)
    (out / "EXPECTED.json").write_text(dump(doc) + "\n")


def owned(names: list[str]) -> list[str]:
    """The top-level entries of DEST these fixtures occupy (README.md there is written by hand, never touched)."""
    return sorted({n.split("/")[0] for n in names})


def dump(obj, indent: str = "") -> str:
    """JSON with one key per line, but a list of numbers (a document, the offsets) on one line."""
    if isinstance(obj, dict) and obj:
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {dump(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(obj, list) and obj and not all(isinstance(x, (int, float)) for x in obj):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + dump(v, inner) for v in obj) + "\n" + indent + "]"
    return json.dumps(obj)


def differences(a: Path, b: Path, name: str) -> list[str]:
    """Files that differ between two files or trees, or exist in only one of them."""
    if a.is_file() or b.is_file():
        same = a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)
        return [] if same else [name]
    names = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()} if a.is_dir() else set()
    names |= {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()} if b.is_dir() else set()
    return [f"{name}/{n}" for n in sorted(names) if not ((a / n).is_file() and (b / n).is_file()
                                                       and filecmp.cmp(a / n, b / n, shallow=False))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="rebuild in a temporary directory and compare bytes")
    args = parser.parse_args()
    found = version("marin-levanter")
    newer = found != LEVANTER_PIN
    if newer and not args.check:
        raise SystemExit(f"writing needs marin-levanter=={LEVANTER_PIN}, found {found}; under a newer Levanter "
                         "only --check runs, on the zstd fixtures")
    with tempfile.TemporaryDirectory(prefix="levanter-fixtures-") as tmp:
        out = Path(tmp) / "levanter"
        out.mkdir()
        if newer:  # its own default codec, no patch: are the zstd fixtures what newer Levanter writes?
            names = [n for n, (zstd, _) in FIXTURES.items() if zstd]
            build(out, names)
            entries = names
        else:
            make(out)
            entries = [*owned(list(FIXTURES)), TOKENIZER_DIR, "EXPECTED.json"]
        os.chdir(ROOT)
        if args.check:
            diff = [d for name in entries for d in differences(DEST / name, out / name, name)]
            print("\n".join(f"differs: {d}" for d in diff) or
                  f"marin-levanter {found}: {len(entries)} fixtures byte-identical to the rebuild")
            return 1 if diff else 0
        DEST.mkdir(parents=True, exist_ok=True)
        for name in entries:
            target = DEST / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            (shutil.copytree if (out / name).is_dir() else shutil.copy2)(out / name, target)
    total = sum(p.stat().st_size for p in DEST.rglob("*") if p.is_file())
    print(f"wrote {DEST.relative_to(ROOT)}/ ({total:,} bytes in files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
