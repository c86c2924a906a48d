"""The shard index, ``shards.parquet``: one row per shard (path, subset, bytes, sha256, docs, tokens,
row_groups), written deterministically and read with every check a hostile index needs.

Why the per-shard list lives in Parquet and not in the JSON manifest: at 23T tokens there are ~100,000
shards; a Parquet index reads in milliseconds with bounded memory and any tool opens it, while the
manifest stays a small, human-readable file. The manifest names the index's sha256, so the index is
trusted only as far as that digest was checked (`marin_data.corpus.manifest.load_corpus`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from marin_data.atomic import atomic_path
from marin_data.corpus.names import check_digest, check_subset_name, safe_relpath
from marin_data.corpus.records import KINDS, SHARD, ShardRecord
from marin_data.errors import InvalidManifestError
from marin_data.layout import LOCK_NAME, MANIFEST, RECORD, SHARDS_INDEX, STAGING, SUMS, TOKENIZER
from marin_data.parquet_io import open_parquet

__all__ = ["read_shard_index", "write_shard_index"]

_INDEX_COLUMNS = ("path", "subset", "bytes", "sha256", "docs", "tokens", "row_groups")
_KIND = "kind"  # written only when some row is not a SHARD, so a Parquet corpus's index keeps its bytes


def _index_schema(kinds: bool = False):
    import pyarrow as pa

    return pa.schema([
        ("path", pa.string()), ("subset", pa.string()), ("bytes", pa.int64()), ("sha256", pa.string()),
        ("docs", pa.int64()), ("tokens", pa.int64()), ("row_groups", pa.int32()),
        *([(_KIND, pa.string())] if kinds else []),
    ])


def write_shard_index(path: str | os.PathLike, shards: Iterable[ShardRecord], *,
                      root: str | os.PathLike | None = None) -> None:
    """Write ``shards.parquet`` atomically, rows sorted by (subset, path) so the bytes are deterministic."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from marin_data.corpus.arrays import numbers, strings

    rows = sorted(shards, key=lambda s: (s.subset, s.path))
    schema = _index_schema(kinds=any(s.kind != SHARD for s in rows))
    values = {f.name: [getattr(s, f.name) for s in rows] for f in schema}
    table = pa.table({f.name: strings(values[f.name]) if f.type == pa.string() else
                      numbers(values[f.name], f.type.to_pandas_dtype()) for f in schema}, schema=schema)
    with atomic_path(path, root=root) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_shard_index(source: str | os.PathLike | bytes, metadata: Iterable[str] = ()) -> list[ShardRecord]:
    """Read ``shards.parquet`` (a path, or its bytes as fetched); raise `InvalidManifestError` on a malformed
    index, an unsafe path, or one that contradicts itself (`_check_paths`; ``metadata`` are the manifest's
    other files, whose names a shard may not take either). Fetched bytes are decoded on the calling thread
    (`marin_data.parquet_io`)."""
    path = "shards.parquet (fetched)" if isinstance(source, bytes) else source
    try:
        with open_parquet(source) as pf:
            columns = [*_INDEX_COLUMNS, *([_KIND] if _KIND in pf.schema_arrow.names else [])]
            table = pf.read(columns=columns)  # no pyarrow.dataset import
        cols = {c: table.column(c).to_pylist() for c in columns}
    except (OSError, KeyError, ValueError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
        raise InvalidManifestError(f"unreadable shard index: {e}", path=str(path)) from e
    shards = [ShardRecord(*values) for values in zip(*(cols[c] for c in columns))]
    for s in shards:
        if s.kind not in KINDS:
            raise InvalidManifestError(f"row {s.path} is of unknown kind {s.kind!r}", path=str(path), actual=s.kind)
        safe_relpath(s.path, where=str(path))
        check_subset_name(s.subset, str(path))
        check_digest(s.sha256, f"{path} row {s.path}")
        if min(s.bytes, s.docs, s.tokens, s.row_groups) < 0:
            raise InvalidManifestError(f"negative size or count in row {s.path}", path=str(path), actual=s)
    _check_paths([s.path for s in shards], set(metadata), str(path))
    return shards


_RESERVED = {MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER, RECORD, LOCK_NAME, STAGING}


def _check_paths(paths: list[str], metadata: set[str], where: str) -> None:
    """Refuse an index that no directory can hold as it says: a path listed twice (or also as a metadata
    file), a path that is also another's folder (``X`` and ``X/inner.parquet``), a reserved name
    (`marin_data.layout`) or a partial file's name, which a download would write or remove."""
    seen: set[str] = set()
    for p in paths:
        if p in seen or p in metadata:
            raise InvalidManifestError(f"{p} is listed twice", path=where, actual=p)
        if p.split("/")[0] in _RESERVED or p.endswith(".part"):
            raise InvalidManifestError(f"{p} is a reserved name", path=where, actual=p)
        seen.add(p)
    files = seen | metadata
    for p in files:
        parents = p.split("/")[:-1]
        for i in range(1, len(parents) + 1):
            if "/".join(parents[:i]) in files:
                raise InvalidManifestError(f"{p} is listed inside the file {'/'.join(parents[:i])}",
                                           path=where, actual=p)
