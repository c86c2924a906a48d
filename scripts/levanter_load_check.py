"""Load a Levanter cache, or a store of them, with real Levanter and compare every document with a marin corpus.

    JAX_PLATFORMS=cpu /tmp/levanter-venv/bin/python scripts/levanter_load_check.py CACHE_OR_STORE CORPUS [--subset S]

Run it in the venv that ``scripts/make_levanter_fixtures.py`` describes (real Levanter 0.2.20, which opens only
blosc clevel 5, so a zstd clevel 1 cache is reported as refused; 0.2.227 in Python 3.12 opens both). marin is never
imported: the corpus is read with pyarrow alone. A cell is a directory holding ``shard_ledger.json``, and the search does not
go below one (a sharded cache's parts, and the per-source caches ``build_or_load_cache`` leaves inside a
consolidated one, are not cells). A cell's path under CACHE_OR_STORE is its subset name; each is opened with
``TreeCache.load`` and its rows are compared, in order, with ``CORPUS/data/<subset>/part-*.parquet`` (columns
``id``, ``tokens``). A single cache is compared with the corpus's only subset, or with ``--subset``.
``--ids`` also requires every id to be ``<subset>:<row>``.

It is the check of ``marin-data convert`` with real Levanter, both ways: a store written by ``--format levanter``
against the corpus it came from, and the caches a corpus written by ``--format marin`` came from against it
(with ``--ids``). docs/design.md ("Converting between the formats") records a run.

Exit codes: 0 every document equal; 1 any difference (tokens, rows, ids, a cell or subset on one side only, a
cache Levanter refuses to open); 2 nothing to compare at the paths given.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

BATCH_ROWS = 4096


def find_cells(root: Path) -> dict[str, Path]:
    """subset name -> cache root, for every directory holding a ledger, not searching inside a found one."""
    if (root / "shard_ledger.json").is_file():
        return {"": root}
    cells: dict[str, Path] = {}
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        cells |= {f"{path.name}/{k}".rstrip("/"): v for k, v in find_cells(path).items()}
    return cells


def corpus_subsets(corpus: Path) -> dict[str, list[Path]]:
    """subset name -> its shards in name order (write order), for every directory of ``data/`` with shards."""
    data = corpus / "data"
    out: dict[str, list[Path]] = {}
    for shard in sorted(data.rglob("part-*.parquet")):
        out.setdefault(shard.parent.relative_to(data).as_posix(), []).append(shard)
    return out


def corpus_rows(shards: list[Path]):
    """(id, tokens as int64) of every document, in order, read with pyarrow alone (no partition columns)."""
    for shard in shards:
        for batch in pq.ParquetFile(shard).iter_batches(batch_size=BATCH_ROWS, columns=["id", "tokens"]):
            ids = batch.column(0).to_pylist()
            tokens = batch.column(1)
            offsets = np.asarray(tokens.offsets)
            values = np.asarray(tokens.values).astype(np.int64)
            for i, doc_id in enumerate(ids):
                yield doc_id, values[offsets[i]:offsets[i + 1]]


class Refused(Exception):
    """Levanter could not open or read a cache: a finding for the table, not a crash of this script."""


def refusal(exc: Exception) -> Refused:
    message = str(exc)
    if "Incompatible" in message:  # tensorstore's reason sits after a long spec, e.g. "clevel": 1 vs 5
        message = message[message.rindex("Incompatible"):].split(" [")[0]
    return Refused(f"{type(exc).__name__}: {message.splitlines()[0][:160]}")


def levanter_rows(cache_root: Path):
    """(dtype, a generator of every row's tokens as int64), as real Levanter reads them; raises Refused."""
    from levanter.store.cache import TreeCache

    try:
        cache = TreeCache.load(str(cache_root), {"input_ids": np.zeros(0, dtype=np.int32)})
        n = len(cache)
        first = cache.get_batch_sync([0])[0]["input_ids"] if n else np.zeros(0, dtype=np.int32)
    except Exception as exc:  # noqa: BLE001 -- whatever Levanter raises is the finding
        raise refusal(exc) from exc

    def rows():
        for start in range(0, n, BATCH_ROWS):
            try:
                batch = cache.get_batch_sync(list(range(start, min(n, start + BATCH_ROWS))))
            except Exception as exc:  # noqa: BLE001
                raise refusal(exc) from exc
            for row in batch:
                yield row["input_ids"].astype(np.int64)

    return str(first.dtype), rows()


def compare_cell(subset: str, cache_root: Path | None, shards: list[Path] | None, check_ids: bool) -> dict:
    """One row of the table: counts on both sides and the first difference, if any."""
    result = {"subset": subset or "(root)", "rows": "-", "corpus rows": "-", "tokens": "-", "corpus tokens": "-",
              "dtype": "-", "result": "ok"}
    if cache_root is None or shards is None:
        result["result"] = "only in the corpus" if cache_root is None else "only in the cache"
        return result
    try:
        dtype, ours = levanter_rows(cache_root)
        result["dtype"] = dtype
        counts = {"rows": 0, "corpus rows": 0, "tokens": 0, "corpus tokens": 0}
        for row, (a, b) in enumerate(itertools.zip_longest(ours, corpus_rows(shards))):  # streamed, in row order
            if a is not None:
                counts["rows"] += 1
                counts["tokens"] += len(a)
            if b is not None:
                counts["corpus rows"] += 1
                counts["corpus tokens"] += len(b[1])
            if result["result"] == "ok" and a is not None and b is not None:
                result["result"] = first_difference(subset, row, a, *b, check_ids)
    except Refused as exc:
        result["result"] = f"levanter refused it: {exc}"
        return result
    result |= counts
    if result["result"] == "ok" and counts["rows"] != counts["corpus rows"]:
        result["result"] = f"row counts differ: levanter {counts['rows']}, corpus {counts['corpus rows']}"
    return result


def first_difference(subset: str, row: int, a: np.ndarray, doc_id: str, b: np.ndarray, check_ids: bool) -> str:
    """"ok", or what differs between Levanter's row and the corpus's."""
    if not np.array_equal(a, b):
        at = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        return (f"row {row} differs at token {at}: levanter {a[at:at + 3].tolist()} (length {len(a)}) vs corpus "
                f"{b[at:at + 3].tolist()} (length {len(b)})")
    if check_ids and doc_id != f"{subset}:{row}":
        return f"row {row} has id {doc_id!r}, expected {subset + ':' + str(row)!r}"
    return "ok"


def table(rows: list[dict]) -> str:
    heads = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in heads]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(r[h]).ljust(w) for h, w in zip(heads, widths)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a Levanter cache root, or a directory of them (a store)")
    parser.add_argument("corpus", type=Path, help="a marin corpus directory (its data/<subset>/part-*.parquet)")
    parser.add_argument("--subset", help="the corpus subset a single cache is compared with")
    parser.add_argument("--ids", action="store_true", help="also require every id to be <subset>:<row>")
    args = parser.parse_args(argv)
    if not args.source.is_dir() or not (cells := find_cells(args.source)):
        print(f"error: no shard_ledger.json at or below {args.source}", file=sys.stderr)
        return 2
    subsets = corpus_subsets(args.corpus)
    if not subsets:
        print(f"error: no data/<subset>/part-*.parquet under {args.corpus}", file=sys.stderr)
        return 2
    if "" in cells:  # a single cache: compare it with one subset
        name = args.subset or (next(iter(subsets)) if len(subsets) == 1 else None)
        if name is None:
            print(f"error: {args.source} is one cache and the corpus has {len(subsets)} subsets; name one with "
                  "--subset", file=sys.stderr)
            return 2
        cells, subsets = {name: cells[""]}, {name: subsets.get(name)}
    print(f"marin-levanter {version('marin-levanter')}, tensorstore {version('tensorstore')}: "
          f"{args.source} vs {args.corpus}")
    rows = [compare_cell(s, cells.get(s), subsets.get(s), args.ids) for s in sorted(set(cells) | set(subsets))]
    print(table(rows))
    bad = [r for r in rows if r["result"] != "ok"]
    print(f"{len(rows) - len(bad)} of {len(rows)} cells identical" + (f"; {len(bad)} differ" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
