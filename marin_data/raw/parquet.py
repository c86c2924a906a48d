"""Read a Parquet file as documents: the text column (and the id column, when there is one) row by row.

Memory is bounded before anything is decoded (docs/security.md, "Memory limits"), from the footer alone: a
row group whose strings decompress to over `_MAX_RATIO` times their stored size is refused, and so is a
front-coded column, whose values may be longer than all that is stored; strings that may repeat
(dictionary-encoded) are read as dictionaries, so a value a thousand rows repeat is decoded once; plain
strings are read in batches of about `_BATCH_BYTES`; and a record over ``max_doc_bytes`` is refused from
its length, never expanded. A file that is not Parquet, or whose data is corrupt, raises
`UnreadableInputError` naming the file and the last good row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from marin_data.errors import UnreadableInputError
from marin_data.fileio.arrays import mask, numbers, string_buffers
from marin_data.fileio.parquet_io import open_parquet
from marin_data.raw.records import MISSING_TEXT, UNDECODABLE, Document, OnBad, reject, too_long

__all__ = ["read_parquet"]

_PARQUET_BATCH = 1024  # rows a Parquet batch holds at most
_BATCH_BYTES = 64 << 20  # plain strings decoded (and records expanded) per batch, about
_MAX_RATIO = 1000  # honest text compresses 3-20x; a page of one repeated byte, 10,000x and more


def read_parquet(path: Path, source: str, text_field: str, id_field: str,
                 on_bad: OnBad | None, max_doc_bytes: int) -> Iterator[Document]:
    """A Parquet file's rows as documents, in row order, a row group at a time, each bounded as above
    before it is decoded; `marin_data.raw.documents.read_documents` says what the arguments are."""
    import pyarrow as pa

    try:
        pf = open_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise UnreadableInputError(f"not a readable Parquet file: {e}", path=str(path)) from e
    schema = pf.schema_arrow
    if text_field not in schema.names or not _is_text(schema.field(text_field).type):
        what = (f"no column {text_field!r} (columns: {', '.join(schema.names)})" if text_field not in schema.names
                else f"column {text_field!r} is of type {schema.field(text_field).type}, not text")
        for row in range(1, pf.metadata.num_rows + 1):  # nothing to decode: every row is a bad record
            reject(on_bad, path, row, MISSING_TEXT, what)
        return
    columns = [text_field] + ([id_field] if id_field in schema.names and id_field != text_field else [])
    strings = [c for c in columns if _is_text(schema.field(c).type)]
    readers = {False: pf}
    row = 0
    for group in range(pf.metadata.num_row_groups):
        chunks = _chunks_of(pf.metadata, group, strings)
        repeats = _check_row_group(chunks, path, group)
        try:
            if repeats and True not in readers:
                readers[True] = open_parquet(path, read_dictionary=strings)
            rows = pf.metadata.row_group(group).num_rows
            stored = sum(c.total_uncompressed_size for c in chunks)
            size = _PARQUET_BATCH if repeats else max(1, min(_PARQUET_BATCH, _BATCH_BYTES * rows // max(stored, 1)))
            for batch in readers[repeats].iter_batches(batch_size=size, row_groups=[group], columns=columns):
                yield from _batch_documents(batch, path, source, text_field, row, on_bad, max_doc_bytes)
                row += batch.num_rows
        except (OSError, pa.ArrowException) as e:
            raise UnreadableInputError(f"corrupt Parquet data after row {row}: {e}", path=str(path)) from e


def _is_text(kind) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind))


def _chunks_of(metadata, group: int, columns: list[str]) -> list:
    g = metadata.row_group(group)
    return [g.column(i) for i in range(g.num_columns) if g.column(i).path_in_schema in columns]


def _check_row_group(chunks: list, path: Path, group: int) -> bool:
    """Refuse a row group whose strings cannot be bounded before decoding (from the footer); True when
    they may repeat (a dictionary encoding), so that they are read as dictionaries."""
    repeats = False
    for chunk in chunks:
        stored, size = chunk.total_compressed_size, chunk.total_uncompressed_size
        if size > max(_BATCH_BYTES, _MAX_RATIO * stored):
            raise UnreadableInputError(
                f"row group {group}: column {chunk.path_in_schema!r} decompresses from {stored:,} to {size:,} "
                f"bytes, over {_MAX_RATIO:,} times (a compression bomb?): refused before decoding", path=str(path))
        if "DELTA_BYTE_ARRAY" in chunk.encodings:  # front coding: a value may be longer than all that is stored
            raise UnreadableInputError(
                f"row group {group}: column {chunk.path_in_schema!r} is front-coded (DELTA_BYTE_ARRAY), whose "
                "decoded size cannot be bounded before decoding: rewrite it with plain or dictionary encoding",
                path=str(path))
        repeats |= bool(set(chunk.encodings) & {"PLAIN_DICTIONARY", "RLE_DICTIONARY"})
    return repeats


def _batch_documents(batch, path: Path, source: str, text_field: str, row: int, on_bad: OnBad | None,
                     max_doc_bytes: int) -> Iterator[Document]:
    """One batch's documents (its rows are ``row + 1...``). A record whose text and id together are over
    ``max_doc_bytes`` is refused from the lengths alone; the others are expanded about `_BATCH_BYTES` at a
    time, in row order."""
    texts = batch.column(0)
    ids = batch.column(1) if batch.num_columns == 2 else None
    sizes = _lengths(texts) + (_lengths(ids) if ids is not None and _is_text(ids.type) else 0)
    valid = mask(texts.is_valid())
    kept = np.flatnonzero(valid & (sizes <= max_doc_bytes))
    # consecutive kept rows, cut where the running size crosses a multiple of _BATCH_BYTES
    parts = np.split(kept, np.flatnonzero(np.diff(np.cumsum(sizes[kept]) // _BATCH_BYTES)) + 1) if len(kept) else []
    part_of = np.full(batch.num_rows, -1, np.int64)
    for number, part in enumerate(parts):
        part_of[part] = number
    expanded: dict[int, tuple[bytes, object]] = {}
    for k in range(batch.num_rows):
        line = row + k + 1
        if not valid[k]:
            reject(on_bad, path, line, MISSING_TEXT, f"column {text_field!r} is null")
            continue
        if sizes[k] > max_doc_bytes:
            too_long(on_bad, path, line, max_doc_bytes)
            continue
        if k not in expanded:  # the first row of the next part: the last part's rows are all handed out
            part = parts[part_of[k]]
            expanded = dict(zip(part.tolist(), zip(_values(texts, part, as_bytes=True), _values(ids, part))))
        raw, doc_id = expanded.pop(k)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            reject(on_bad, path, line, UNDECODABLE, f"text is not UTF-8 ({e.reason} at byte {e.start})")
            continue
        yield Document(id=f"{source}:{line}" if doc_id is None else str(doc_id), text=text, path=str(path), line=line)


def _lengths(array) -> np.ndarray:
    """``[n]`` int64: each value's length in bytes (0 for a null), from offsets alone: a dictionary array's
    values are not expanded."""
    import pyarrow as pa

    valid = mask(array.is_valid())
    if pa.types.is_dictionary(array.type):
        per = np.diff(string_buffers(array.dictionary)[0])
        if not len(per):
            return np.zeros(len(array), np.int64)
        indices = array.indices  # a null's slot holds any index: clipped, then zeroed
        width = indices.type.bit_width // 8
        raw = np.frombuffer(indices.buffers()[1], f"i{width}", len(indices), indices.offset * width)
        return per[np.clip(raw, 0, len(per) - 1)] * valid
    return np.diff(string_buffers(array)[0]) * valid


def _values(array, rows: np.ndarray, *, as_bytes: bool = False) -> list:
    """The values of ``rows`` as Python objects (as bytes with ``as_bytes``); Nones when there is no array."""
    import pyarrow as pa

    if array is None:
        return [None] * len(rows)
    taken = array.take(numbers(rows, np.int64))
    if pa.types.is_dictionary(taken.type):
        taken = taken.dictionary_decode()
    return (taken.cast(pa.large_binary()) if as_bytes else taken).to_pylist()
