"""Read raw documents from the input formats ``marin-data shard`` accepts.

JSON Lines (``.jsonl``, ``.ndjson``, ``.json`` — Dolma names its JSON Lines ``*.json.gz``), plain or
compressed with gzip (``.gz``) or zstd (``.zst``/``.zstd``), and Parquet. Each record becomes a `Document`
carrying where it came from, so every error can name the file and the line (for Parquet: the 1-based row).

Two kinds of failure, as `marin_data.errors` names them:

- a bad *record* (malformed JSON, a missing or non-string text field, bytes that are not UTF-8, a document
  over ``max_doc_bytes``) raises
  `BadRecordError` with a ``reason`` key — or, when the caller passes ``on_bad``, is handed to it and
  skipped, which is how ``--skip-bad`` counts skips by reason;
- a bad *file* (missing, unreadable, a truncated or corrupt gzip/zstd/Parquet stream) raises
  `UnreadableInputError` naming the file and the last good line. ``--skip-bad`` does not skip these: a
  truncated archive loses an unknown number of documents, which no count of skipped records can report.

Memory is bounded whatever the file holds: decompression yields at most 1 MiB per step (a 180 KB zstd file
can expand to GiBs), and a line longer than ``max_doc_bytes`` is refused (or skipped) as soon as it passes
the limit, never buffered whole: tokenizing a document takes many times its size (docs/security.md).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

import numpy as np

from marin_data.fileio.arrays import mask, numbers, string_buffers
from marin_data.errors import BadRecordError, UnreadableInputError
from marin_data.fileio.parquet_io import open_parquet
from marin_data.fileio.untrusted_json import loads

__all__ = [
    "Document",
    "BAD_JSON",
    "MISSING_TEXT",
    "UNDECODABLE",
    "TOO_LONG",
    "DEFAULT_MAX_DOC_BYTES",
    "input_format",
    "expand_inputs",
    "source_names",
    "read_documents",
]

# Reasons a record is bad: the keys of the skip counts that --skip-bad reports.
BAD_JSON = "bad_json"
MISSING_TEXT = "missing_text"
UNDECODABLE = "undecodable"
TOO_LONG = "too_long"

DEFAULT_MAX_DOC_BYTES = 8 << 20  # one document's JSON line or text; tokenizing it peaks at many times this

_JSONL = (".jsonl", ".ndjson", ".json")
_COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_PARQUET_BATCH = 1024  # rows a Parquet batch holds at most
_READ = 1 << 20  # input read and decompressed output per step
_ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default cap (what `zstd --long` writes); a larger window is refused
_ZSTD_MAGIC = 0xFD2FB528


@dataclass(frozen=True, slots=True)
class Document:
    id: str
    text: str
    path: str  # the input file it came from
    line: int  # 1-based line (JSON Lines) or row (Parquet)


def input_format(path: str | os.PathLike) -> str:
    """``"jsonl"``, ``"jsonl.gzip"``, ``"jsonl.zstd"`` or ``"parquet"``, from the file name.

    Raises:
        UnreadableInputError: the name has none of the supported suffixes.
    """
    suffixes = [s.lower() for s in PurePath(path).suffixes[-2:]]
    if suffixes and suffixes[-1] == ".parquet":
        return "parquet"
    compression = _COMPRESSION.get(suffixes[-1]) if suffixes else None
    base = suffixes[-2] if compression and len(suffixes) == 2 else (suffixes[-1] if suffixes else "")
    if base in _JSONL:
        return f"jsonl.{compression}" if compression else "jsonl"
    raise UnreadableInputError(
        "unsupported input format: expected .jsonl/.ndjson/.json (optionally .gz, .zst or .zstd) or .parquet",
        path=str(path),
    )


def expand_inputs(patterns: Sequence[str | os.PathLike]) -> list[Path]:
    """Expand files, directories (every supported file below, recursively) and globs (``**`` recurses).

    Returns absolute paths, sorted and de-duplicated, so a run's work is planned the same way whatever
    order the shell listed the files in.

    Raises:
        UnreadableInputError: a path that does not exist, a glob that matches nothing, a directory with no
            supported file, or a file of an unsupported format.
    """
    found: set[Path] = set()
    for pattern in patterns:
        pattern = os.fspath(pattern)
        if glob.has_magic(pattern):
            hits = [Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
            if not hits:
                raise UnreadableInputError("no input file matches this pattern", path=pattern)
        elif os.path.isdir(pattern):
            hits = [p for p in Path(pattern).rglob("*") if p.is_file() and not p.name.startswith(".")
                    and _supported(p)]
            if not hits:
                raise UnreadableInputError("directory holds no .jsonl/.json(.gz/.zst) or .parquet file",
                                           path=pattern)
        elif os.path.isfile(pattern):
            hits = [Path(pattern)]
        else:
            raise UnreadableInputError("no such input file", path=pattern)
        for p in hits:
            input_format(p)
            found.add(Path(os.path.abspath(p)))
    return sorted(found)


def source_names(paths: Sequence[Path]) -> list[str]:
    """Each path relative to the inputs' common directory, as POSIX paths.

    These names (not absolute paths) go into default document ids and the subset's record of its inputs,
    so the same files sharded from another directory or machine give the same bytes.
    """
    if not paths:
        return []
    base = os.path.commonpath([os.path.dirname(p) for p in paths])
    return [Path(os.path.relpath(p, base)).as_posix() for p in paths]


OnBad = Callable[[BadRecordError], None]


def read_documents(
    path: str | os.PathLike,
    *,
    source: str | None = None,
    text_field: str = "text",
    id_field: str = "id",
    on_bad: OnBad | None = None,
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
) -> Iterator[Document]:
    """Yield the documents of one input file in file order.

    Args:
        path: a file in one of the supported formats.
        source: the name used in default ids (``"<source>:<line>"``, for records without an id); defaults
            to the file name.
        text_field: the field (JSON) or column (Parquet) holding the text.
        id_field: the field or column holding the id; records without one get a default id.
        on_bad: called with each `BadRecordError` instead of raising it; the record is then skipped.
        max_doc_bytes: the longest record (a JSON line, a Parquet text value) in bytes; a longer one is a bad
            record (reason `TOO_LONG`).

    Raises:
        BadRecordError: a malformed record, when ``on_bad`` is None.
        UnreadableInputError: the file cannot be opened, or its stream is corrupt or truncated.
    """
    path = Path(path)
    fmt = input_format(path)
    source = path.name if source is None else source
    if fmt == "parquet":
        yield from _read_parquet(path, source, text_field, id_field, on_bad, max_doc_bytes)
    else:
        yield from _read_jsonl(path, fmt, source, text_field, id_field, on_bad, max_doc_bytes)


def _reject(on_bad: OnBad | None, path: Path, line: int, reason: str, message: str) -> None:
    err = BadRecordError(message, path=str(path), line=line, reason=reason)
    if on_bad is None:
        raise err
    on_bad(err)


def _chunks(path: Path, fmt: str) -> Iterator[bytes]:
    """The decompressed bytes of a JSON Lines file, in 1 MiB reads."""
    with open(path, "rb") as raw:
        if fmt == "jsonl.gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:  # multi-member; EOFError when truncated
                while chunk := gz.read(_READ):
                    yield chunk
        elif fmt == "jsonl.zstd":
            yield from _zstd_chunks(raw)
        else:
            while chunk := raw.read(_READ):
                yield chunk


def _zstd_chunks(raw: io.BufferedIOBase) -> Iterator[bytes]:
    """Decompress concatenated zstd frames at most 1 MiB at a time, raising `EOFError` if the file ends
    inside a frame.

    ``decompressobj().decompress`` has no output limit (1 MiB of input can expand to GiBs), so the bounded
    ``stream_reader`` decompresses; it treats a truncated file as a clean end of stream, which would silently
    drop the documents after the cut, so the frame headers are then walked to notice an unfinished frame.
    """
    import zstandard

    dctx = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    with dctx.stream_reader(raw, read_size=_READ, read_across_frames=True, closefd=False) as reader:
        while chunk := reader.read(_READ):
            yield chunk
    if not _zstd_frames_complete(raw):
        raise EOFError("the file ends inside a zstd frame (truncated)")


def _zstd_frames_complete(f: io.BufferedIOBase) -> bool:
    """True when the file is whole zstd frames (and skippable frames), from their headers alone (RFC 8878)."""
    end = f.seek(0, os.SEEK_END)
    pos = 0
    while pos < end:
        f.seek(pos)
        head = f.read(8)
        if len(head) < 5:
            return False
        magic = int.from_bytes(head[:4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: its size follows the magic
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            return False
        desc = head[4]
        single = desc >> 5 & 1
        pos += 5 + (not single) + (0, 1, 2, 4)[desc & 3] + (single, 2, 4, 8)[desc >> 6]
        last = 0
        while not last:  # blocks: a 3-byte header (last flag, type, size); an RLE block holds one byte
            f.seek(pos)
            block = f.read(3)
            if len(block) < 3:
                return False
            h = int.from_bytes(block, "little")
            last, kind = h & 1, h >> 1 & 3
            pos += 3 + (1 if kind == 1 else h >> 3)
        pos += 4 * (desc >> 2 & 1)  # the content checksum
    return pos == end


def _stream_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    return (OSError, EOFError, zlib.error, zstandard.ZstdError)


def _read_jsonl(path: Path, fmt: str, source: str, text_field: str, id_field: str,
                on_bad: OnBad | None, max_doc_bytes: int) -> Iterator[Document]:
    line = 0
    tail = b""  # the start of the next line
    dropping = False  # inside a line refused as too long: its bytes are dropped up to its end
    chunks = _chunks(path, fmt)
    while True:
        try:
            chunk = next(chunks, None)
        except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
            raise UnreadableInputError(f"cannot open: {e.strerror}", path=str(path)) from e
        except _stream_errors() as e:
            raise UnreadableInputError(f"corrupt or truncated {fmt} data after line {line}: {e}",
                                       path=str(path)) from e
        if chunk is None:
            lines = [tail] if tail or dropping else []
        else:
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
        for raw in lines:
            line += 1
            if dropping:  # the end of a line already refused
                dropping = False
            elif len(raw) > max_doc_bytes:
                _too_long(on_bad, path, line, max_doc_bytes)
            elif raw.strip():  # blank lines (a trailing newline, hand-edited files) are not records
                doc = _parse_json_record(raw, path, line, source, text_field, id_field, on_bad)
                if doc is not None:
                    yield doc
        if chunk is None:
            return
        if len(tail) > max_doc_bytes or dropping:
            if not dropping:
                _too_long(on_bad, path, line + 1, max_doc_bytes)
            tail, dropping = b"", True


def _too_long(on_bad: OnBad | None, path: Path, line: int, max_doc_bytes: int) -> None:
    _reject(on_bad, path, line, TOO_LONG, f"document over {max_doc_bytes:,} bytes: raise --max-doc-bytes to "
                                          "keep it (tokenizing takes many times its size), or --skip-bad")


def _parse_json_record(raw: bytes, path: Path, line: int, source: str, text_field: str, id_field: str,
                       on_bad: OnBad | None) -> Document | None:
    try:
        obj = loads(raw)
    except UnicodeDecodeError as e:
        _reject(on_bad, path, line, UNDECODABLE, f"line is not UTF-8 ({e.reason} at byte {e.start})")
        return None
    except ValueError as e:
        _reject(on_bad, path, line, BAD_JSON, f"malformed JSON: {e}")
        return None
    if not isinstance(obj, dict):
        _reject(on_bad, path, line, BAD_JSON, f"a JSON {type(obj).__name__}, not an object")
        return None
    text = obj.get(text_field)
    if not isinstance(text, str):
        what = "no" if text is None else f"a {type(text).__name__}, not a string, in"
        _reject(on_bad, path, line, MISSING_TEXT, f"{what} text field {text_field!r}")
        return None
    if not _is_unicode(text):
        _reject(on_bad, path, line, UNDECODABLE, "text holds lone surrogates (\\ud800-\\udfff): not valid Unicode")
        return None
    doc_id = obj.get(id_field)
    return Document(id=f"{source}:{line}" if doc_id is None else str(doc_id), text=text, path=str(path), line=line)


def _is_unicode(text: str) -> bool:
    """False for text holding surrogates (JSON ``\\ud800`` escapes), which no tokenizer can encode."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_parquet(path: Path, source: str, text_field: str, id_field: str,
                  on_bad: OnBad | None, max_doc_bytes: int) -> Iterator[Document]:
    """A Parquet file's rows as documents, a row group at a time, each bounded before it is decoded
    (docs/security.md, "Memory limits"): a row group whose strings decompress to over `_MAX_RATIO` times
    their stored size is refused; one whose strings may repeat (dictionary-encoded) is read as
    dictionaries, so a value a thousand rows repeat is decoded once; plain strings are read in batches of
    about `_BATCH_BYTES`; and a record over ``max_doc_bytes`` is refused from its length, never expanded."""
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
            _reject(on_bad, path, row, MISSING_TEXT, what)
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


_BATCH_BYTES = 64 << 20  # plain strings decoded (and records expanded) per batch, about
_MAX_RATIO = 1000  # honest text compresses 3-20x; a page of one repeated byte, 10,000x and more


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
            _reject(on_bad, path, line, MISSING_TEXT, f"column {text_field!r} is null")
            continue
        if sizes[k] > max_doc_bytes:
            _too_long(on_bad, path, line, max_doc_bytes)
            continue
        if k not in expanded:  # the first row of the next part: the last part's rows are all handed out
            part = parts[part_of[k]]
            expanded = dict(zip(part.tolist(), zip(_values(texts, part, as_bytes=True), _values(ids, part))))
        raw, doc_id = expanded.pop(k)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            _reject(on_bad, path, line, UNDECODABLE, f"text is not UTF-8 ({e.reason} at byte {e.start})")
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


def _supported(path: Path) -> bool:
    try:
        input_format(path)
    except UnreadableInputError:
        return False
    return True
