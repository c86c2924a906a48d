"""The shard index, ``shards.parquet``: one row per shard (path, subset, bytes, sha256, docs, tokens,
row_groups), written deterministically and read with every check a hostile index needs.

Why the per-shard list lives in Parquet and not in the JSON manifest: at 23T tokens there are ~100,000
shards; a Parquet index reads in milliseconds with bounded memory and any tool opens it, while the
manifest stays a small, human-readable file. The manifest names the index's sha256, so the index is
trusted only as far as that digest was checked (`marin_data.corpus.manifest.load_corpus`).
"""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Iterable

import numpy as np

from marin_data.fileio.arrays import mask, numbers, string_buffers, strings, view
from marin_data.fileio.atomic import atomic_path
from marin_data.corpus.names import (METADATA_NAMES, WRITER_NAMES, bad_digests, check_digest, check_subset_name,
                                     reserved_paths, safe_relpath, unsafe_paths)
from marin_data.corpus.records import KINDS, SHARD, ShardRecord
from marin_data.errors import InvalidManifestError, shown
from marin_data.fileio.parquet_io import decoded_bound, open_parquet

__all__ = ["MAX_INDEX_BYTES", "read_shard_index", "write_shard_index"]

# What a shard index may decode to: ~150 bytes a row today, so over 1.5 million shards (Marin's corpus has
# ~100,000), and within the loader's start-up budget of 300 MB.
MAX_INDEX_BYTES = 256 << 20

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

    rows = sorted(shards, key=lambda s: (s.subset, s.path))
    schema = _index_schema(kinds=any(s.kind != SHARD for s in rows))
    values = {f.name: [getattr(s, f.name) for s in rows] for f in schema}
    table = pa.table({f.name: strings(values[f.name]) if f.type == pa.string() else
                      numbers(values[f.name], f.type.to_pandas_dtype()) for f in schema}, schema=schema)
    with atomic_path(path, root=root) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_shard_index(source: str | os.PathLike | bytes, metadata: Iterable[str] = (), *,
                     max_bytes: int | None = None) -> list[ShardRecord]:
    """Read ``shards.parquet`` (a path, or its bytes as fetched) and check every row.

    Raises `InvalidManifestError` (naming the row) on a malformed index: one that may decode to more than
    ``max_bytes`` (default `MAX_INDEX_BYTES`; bounded from its footer before anything is decoded, then from
    the lengths of its values before they are expanded), a missing column, a column of the wrong type or with a null, a row with an
    unsafe path, an invalid subset name, a digest that is not hex sha256 or a negative count, and an index
    that contradicts itself (`_check_paths`; ``metadata`` are the manifest's other files, whose names a shard
    may not take either). The checks run over whole columns (a 100,000-row index is checked in tens of
    milliseconds), and the first bad row in index order is the one reported. Fetched bytes are decoded on the
    calling thread (`marin_data.fileio.parquet_io`).
    """
    where = "shards.parquet (fetched)" if isinstance(source, bytes) else str(source)
    max_bytes = MAX_INDEX_BYTES if max_bytes is None else max_bytes
    try:
        # Strings are read as dictionaries: a value that many rows repeat is decoded once (and checked once).
        with open_parquet(source, read_dictionary=list(_STRINGS)) as pf:
            kinds = _KIND in pf.schema_arrow.names
            wanted = (*_INDEX_COLUMNS, *([_KIND] if kinds else []))
            bound = decoded_bound(pf.metadata, wanted, dictionary=_STRINGS)
            if bound > max_bytes:
                raise InvalidManifestError(f"{pf.metadata.num_rows:,} rows that may decode to {bound:,} bytes, "
                                           f"over the {max_bytes:,} a shard index may take", path=where)
            table = pf.read(columns=list(wanted))  # no pyarrow.dataset import
        for name in (*_STRINGS, *([_KIND] if kinds else [])):
            table.column(name).validate(full=True)  # valid UTF-8, or the checks below could not read it
    except InvalidManifestError:
        raise
    except (OSError, KeyError, ValueError) as e:  # pyarrow raises ArrowInvalid (a ValueError) on garbage
        raise InvalidManifestError(f"unreadable shard index: {e}", path=where) from e
    columns = {name: _column(table, name, where) for name in wanted}
    expanded = table.num_rows * 8 * (len(_INDEX_COLUMNS) - len(_STRINGS))
    for name in _STRINGS:
        offsets, _ = string_buffers(columns[name].dictionary)
        expanded += int(np.diff(offsets)[view(columns[name].indices, np.int32)].sum())
    if expanded > max_bytes:
        raise InvalidManifestError(f"{table.num_rows:,} rows whose names take {expanded:,} bytes, over the "
                                   f"{max_bytes:,} a shard index may take", path=where)
    subsets = columns["subset"]  # each distinct subset name is checked once
    names = subsets.dictionary.to_pylist()
    bad_names = np.array([not _is_subset_name(name, where) for name in names], bool)
    paths, digests = columns["path"].dictionary_decode(), columns["sha256"].dictionary_decode()
    counts = [view(columns[name], np.int64) for name in _INDEX_COLUMNS if name not in _STRINGS]
    bad = unsafe_paths(paths) | bad_digests(digests) | (np.minimum.reduce(counts) < 0)
    if len(names):
        bad |= bad_names[view(subsets.indices, np.int32)]
    kind_names = columns[_KIND].dictionary.to_pylist() if kinds else [SHARD]
    kind_of = view(columns[_KIND].indices, np.int32) if kinds else np.zeros(table.num_rows, np.int32)
    if len(kind_names):
        bad |= np.array([k not in KINDS for k in kind_names], bool)[kind_of]
    # plain arrays to Python (a dictionary array's own to_pylist is ~30x slower); rows share subset names
    values = {name: columns[name].to_pylist() for name in _INDEX_COLUMNS if name not in _STRINGS}
    values.update(path=paths.to_pylist(), sha256=digests.to_pylist(),
                  subset=[names[i] for i in view(subsets.indices, np.int32).tolist()],
                  kind=[kind_names[i] for i in kind_of.tolist()] if kinds else itertools.repeat(SHARD))
    if bad.any():
        row = int(np.argmax(bad))
        _refuse_row(ShardRecord(*(values[name][row] for name in _INDEX_COLUMNS), kind_names[kind_of[row]]), where)
    _check_paths(paths, values["path"], set(metadata), where)
    return _records(values)


_STRINGS = ("path", "subset", "sha256")
_TEXT = (*_STRINGS, _KIND)  # the columns read as dictionaries of strings


def _records(values: dict[str, list]) -> list[ShardRecord]:
    """The rows as records. The garbage collector is paused while they are made: otherwise their allocations
    trigger collections that walk every record made so far (*measured* for 100,000 rows on a loaded 2-core
    machine: 0.14-0.17 s paused, 0.34-0.43 s not)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return list(map(ShardRecord._make, zip(*(values[name] for name in (*_INDEX_COLUMNS, _KIND)))))
    finally:
        if enabled:
            gc.enable()


def _column(table, name: str, where: str):
    """One column as a single null-free array: strings as dictionaries, integers as int64 (rows named 1-based)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(name).combine_chunks()  # a dictionary per row group, unified
    if name == _KIND and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        column = column.dictionary_encode()  # a few distinct values, read plainly (it may be absent)
    if name in _TEXT:
        ok = pa.types.is_dictionary(column.type) and (pa.types.is_string(column.type.value_type)
                                                      or pa.types.is_large_string(column.type.value_type))
    else:
        ok = pa.types.is_integer(column.type)
    if not ok:
        what = "strings" if name in _TEXT else "integers"
        shown_type = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        raise InvalidManifestError(f"column {name} holds {shown_type}, not {what}", path=where,
                                   actual=str(shown_type))
    if column.null_count:
        row = int(np.argmax(mask(column.is_null()))) + 1
        raise InvalidManifestError(f"row {row} has no {name} (null)", path=where, actual=row)
    if name in _TEXT:
        return column
    try:
        return pc.cast(column, pa.int64())
    except ValueError as e:  # a uint64 beyond int64
        raise InvalidManifestError(f"column {name} holds a value out of range: {e}", path=where) from e


def _is_subset_name(name: str, where: str) -> bool:
    try:
        check_subset_name(name, where)
    except InvalidManifestError:
        return False
    return True


def _refuse_row(row: ShardRecord, where: str) -> None:
    """Raise the error of the first check ``row`` fails, in the order a row is checked."""
    if row.kind not in KINDS:
        raise InvalidManifestError(f"row {_name(row.path)} is of unknown kind {shown(row.kind)!r}", path=where,
                                   actual=row.kind)
    safe_relpath(row.path, where=where)
    check_subset_name(row.subset, where)
    check_digest(row.sha256, f"{where} row {_name(row.path)}")
    raise InvalidManifestError(f"negative size or count in row {_name(row.path)}", path=where, actual=row)


def _name(path: str) -> str:
    """A path as a message names it: as it is, or cut short when it is long (`shown`)."""
    return path if len(path) <= 120 else shown(path)


def _check_paths(paths, names: list[str], metadata: set[str], where: str) -> None:
    """Refuse an index that no directory can hold as it says: a path listed twice (or also as a metadata
    file), a reserved name (`marin_data.layout`) or a partial file's name, which a download would write or
    remove, and a path that is also another's folder (``X`` and ``X/inner.parquet``).

    ``paths`` is the column and ``names`` the same paths as Python strings. All files (paths, then
    ``metadata``) are sorted once with ``/`` read as the lowest byte (NUL, which no safe path holds), so a
    file's descendants, if any, come right after it: each check compares neighbours.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(names)
    extra = sorted(metadata)
    files = pa.concat_arrays([paths.cast(pa.large_string()), strings(extra).cast(pa.large_string())])
    keys = pc.replace_substring(files, "/", "\x00")
    indices = pc.sort_indices(keys)  # a stable sort: equal paths stay in row order
    ordered, order = keys.take(indices), view(indices, np.uint64).astype(np.int64)
    same = mask(pc.equal(ordered.slice(1), ordered.slice(0, max(0, len(order) - 1))))
    first, later = order[:-1][same], order[1:][same]
    twice = np.zeros(n, bool)
    twice[np.where(later >= n, first, later)] = True  # a path after its equal, or a path a metadata file takes
    reserved = reserved_paths(paths, WRITER_NAMES + METADATA_NAMES)
    if (twice | reserved).any():
        row = int(np.argmax(twice | reserved))
        what = "is listed twice" if twice[row] else "is a reserved name"
        raise InvalidManifestError(f"{_name(names[row])} {what}", path=where, actual=names[row])
    offsets, data = string_buffers(ordered)
    length = np.diff(offsets)
    # neighbour k + 1 is inside file k when it is longer, holds NUL (a "/") right after k's length, and
    # starts with k: the first two in numpy, the last for those few candidates
    after = offsets[1:-1] + length[:-1]
    inside = np.flatnonzero(length[1:] > length[:-1])
    inside = inside[data[after[inside]] == 0]
    every = names + extra
    for k in inside.tolist():
        outer, inner = every[order[k]], every[order[k + 1]]
        if inner.startswith(outer + "/"):
            raise InvalidManifestError(f"{_name(inner)} is listed inside the file {_name(outer)}", path=where,
                                       actual=inner)
